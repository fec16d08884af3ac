"""The lab's container runtime (what LXC does on a real PVE node), standard library only.

- :mod:`ct.conf`    the main section of ``/etc/pve/lxc/<vmid>.conf`` (hostname, devN,
  ``lxc.mount.entry``, ``lxc.cgroup2.devices.allow``);
- :mod:`ct.runtime` ``start``/``stop``/``status``/``exec_in``/``push``/``pull``: a container is
  an overlay rootfs in its own mount/pid/uts/ipc namespaces whose PID 1 is the lab's init
  and systemd stand-in (seeded from ``/usr/lib/kpro-lab/ct-seed``, source ``tests/lab/rootfs-ct``).

Callers (pct, the PVE API) put ``/usr/lib/kpro-lab`` on ``sys.path`` and
``from ct import runtime``.
"""
