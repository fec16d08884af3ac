"""The lab's Proxmox VE releases (labctl.py up --release pve8|pve9): each node release's root, apt sources, package
mirror repository and seeded kernels; the bookworm roots keep their cache names."""

import argparse
import os
import sys

import pytest

from conftest import LAB, lablib

if LAB not in sys.path:
    sys.path.insert(0, LAB)

import rootfs_cache  # noqa: E402


def test_each_release_has_its_root_and_the_container_stays_bookworm():
    assert rootfs_cache.RELEASES == {"pve8": "pve8", "pve9": "pve9"}
    assert os.path.basename(rootfs_cache.rootfs_dir("pve9")).startswith("rootfs-trixie-pve9-")
    assert os.path.basename(rootfs_cache.rootfs_dir("pve8")).startswith("rootfs-bookworm-pve8-")
    assert os.path.basename(rootfs_cache.rootfs_dir("ct")).startswith("rootfs-bookworm-ct-")
    # a node's Debian packages and the container's come from their own suite's repository
    assert [rootfs_cache.REPO_OF_SUITE[rootfs_cache.SUITES[v]] for v in ("pve8", "ct", "pve9")] == ["debian", "debian", "trixie"]


def test_pve9_has_deb822_sources_only():
    srcs = rootfs_cache.sources("pve9")
    assert sorted(srcs) == ["etc/apt/sources.list.d/debian.sources", "etc/apt/sources.list.d/proxmox.sources"]
    assert "URIs: http://10.213.5.1:18600/apt/trixie\nSuites: ./\n" in srcs["etc/apt/sources.list.d/debian.sources"]
    assert "URIs: http://10.213.5.1:18600/apt/pve\n" in srcs["etc/apt/sources.list.d/proxmox.sources"]
    assert sorted(rootfs_cache.sources("pve8")) == ["etc/apt/sources.list", "etc/apt/sources.list.d/pve-no-subscription.list"]


def test_the_pve9_stock_list_lacks_what_a_fresh_pve9_lacks():
    pkgs = set(rootfs_cache.stock_packages("pve9"))
    assert {"python3", "python3.13", "kmod", "binutils", "openssh-server", "ifupdown2", "sqv"} <= pkgs
    assert not pkgs & {"gcc", "make", "libc6-dev", "build-essential", "dkms", "python3-proxmoxer", "python3-requests",
                       "curl", "ceph-common"}


def test_a_pve9_node_is_seeded_with_the_9_1_kernels(tmp_path):
    seed = lablib("seed")
    st = seed.seed(str(tmp_path / "root"), release="pve9")
    assert st["kernel"]["release"] == "6.17.13-2-pve"
    assert st["kernel"]["installed"] == ["6.17.2-1-pve", "6.17.13-2-pve"] == st["kernel"]["headers_available"]
    st8 = seed.seed(str(tmp_path / "root8"))
    assert st8["kernel"]["release"] == "6.8.12-9-pve" and st8["kernel"]["installed"] == ["6.8.12-4-pve", "6.8.12-9-pve"]


def test_a_fresh_disk_takes_the_release_asked_for_and_a_kept_one_keeps_its_own(tmp_path, monkeypatch):
    labctl = lablib("labctl")
    run = tmp_path / "run"
    monkeypatch.setattr(labctl, "RUN", str(run))
    monkeypatch.setattr(labctl, "RELEASE_FILE", str(run / "release"))
    monkeypatch.setattr(labctl, "UPPER", str(run / "kpro5" / "upper"))
    monkeypatch.delenv("KPGS_LAB_RELEASE", raising=False)
    assert labctl.lab_release() == "pve8"  # a disk from before releases existed
    monkeypatch.setenv("KPGS_LAB_RELEASE", "pve9")
    assert labctl.settle_release(argparse.Namespace()) == "pve9" and labctl.lab_release() == "pve9"
    os.makedirs(str(run / "kpro5" / "upper" / "etc"))  # the disk is seeded now
    monkeypatch.delenv("KPGS_LAB_RELEASE")
    assert labctl.settle_release(argparse.Namespace()) == "pve9"  # kept disk, nothing asked: its own
    with pytest.raises(SystemExit) as e:
        labctl.settle_release(argparse.Namespace(release="pve8"))
    assert "the node's disk is pve9, not pve8: `labctl.py reset --release pve8`" in str(e.value)
    with pytest.raises(SystemExit):
        labctl.settle_release(argparse.Namespace(release="pve7"))
