"""kpro lab: the kernel API changes the NVIDIA 580 module source must know, and the compiler's words when it does not.

nvidia-installer and DKMS have no upper kernel bound: the driver's kernel-open/conftest.sh probes each kernel API
change it knows, and a change it does not know is a compile error in make.log (dkms: "Bad return status for module
build", exit 10). The lab's kernels are version strings, so the lab's source knows what the real one knows: for each
change, the kernel series it arrived in, the first 580 release whose source handles it, and the error an older
release's build prints (github.com/NVIDIA/open-gpu-kernel-modules, kernel-open/ at the tags named):

- 6.18, get_dev_pagemap() lost its second argument: conftest get_dev_pagemap_has_pgmap_arg from 580.119.02; 580.105.08
  fails at uvm_va_range_device_p2p.c:363 (its build log in NixOS/nixpkgs#467145, "too many arguments to function").
- 6.19, zone_device_page_init() takes pgmap and order: zone_device_page_init_has_pgmap_and_order_args from 580.126.18;
  580.126.09's uvm_hmm.c:84 calls it with one argument (NixOS/nixpkgs#492422 fails there, uvm_hmm.c:2159 expansion).
- 7.0, __is_vma_write_locked() lost mm_lock_seq (kernel commit 22f7639f2f03, v7.0-rc1): handled from 580.142
  (common/inc/nv-mm.h); 580.126.x's nvidia/nv-mmap.c:922 passes two arguments.
- 7.1, linux/of_gpio.h removed: 580.142's common/inc/nv-linux.h:1774 includes it (NixOS/nixpkgs#538659); NVIDIA's
  580.159.04 notes "Fixed kernel module build issue with Linux kernel v7.1".

Standard library only; runs in the node (dkms stand-in) and on the controller (unit tests).
"""

import re
import time

# (kernel series, first release that builds, the compiler's error for an older one, its object file)
CHANGES = (
    ((6, 18), (580, 119, 2), "nvidia-uvm/uvm_va_range_device_p2p.c:363:13: error: too many arguments to function "
                             "'get_dev_pagemap'", "nvidia-uvm/uvm_va_range_device_p2p.o"),
    ((6, 19), (580, 126, 18), "nvidia-uvm/uvm_hmm.c:84:39: error: too few arguments to function 'zone_device_page_init'",
     "nvidia-uvm/uvm_hmm.o"),
    ((7, 0), (580, 142), "nvidia/nv-mmap.c:922:9: error: too many arguments to function '__is_vma_write_locked'",
     "nvidia/nv-mmap.o"),
    ((7, 1), (580, 159, 4), "common/inc/nv-linux.h:1774:10: fatal error: linux/of_gpio.h: No such file or directory",
     "nvidia/nv.o"),
)


def _numbers(text):
    return tuple(int(p) for p in re.findall(r"[0-9]+", str(text)))


def build_errors(version, kernel):
    """[(error line, object)] the module source of NVIDIA ``version`` (a 580 release) meets on ``kernel``; [] when
    it builds (another branch: the lab does not model it)."""
    v, k = _numbers(version), _numbers(kernel)[:2]
    if v[:1] != (580,):
        return []
    return [(err, obj) for series, first, err, obj in CHANGES if k >= series and v < first]


def make_log(module, version, kernel, errors):
    """make.log of the failed build, as dkms 3.0.10 actual_build() writes it (dkms.in:1068-1072: its header line, the
    date, then make's output), ending as a PVE kernel's Makefile ends a failed module build (the make.log of
    NVIDIA/open-gpu-kernel-modules#1143, on 6.17.13-2-pve: Makefile:2016 and :248)."""
    src = "/usr/src/linux-headers-%s" % kernel
    lines = ["DKMS make.log for %s-%s for kernel %s (x86_64)" % (module, version, kernel),
             time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())]
    lines += [err for err, _obj in errors]
    lines += ["make[3]: *** [%s/Makefile:2016: .] Error 2" % src, "make[2]: *** [%s/Makefile:248: __sub-make] Error 2" % src]
    return "\n".join(lines) + "\n"
