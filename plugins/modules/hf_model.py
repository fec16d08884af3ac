#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_model
short_description: Download a pinned revision of a Hugging Face model into a directory, resumably and verified
version_added: "0.1.0"
description:
  - Makes O(local_dir) hold the files of O(repo_id) at O(revision) (optionally filtered by O(allow_patterns) and
    O(ignore_patterns)), as listed by the hub's tree API.
  - "Completeness is decided first: every listed file present with the listed size and, when O(verify=true),
    a matching checksum (the sha256 of LFS files, the git blob sha1 of the others). A checksum is computed once and
    remembered with the file's size, mtime and hub object id under C(<local_dir>/.cache/kpro-hf/), so a complete
    model is not hashed again on every run. When O(revision) is a commit sha whose listing is cached there, a
    complete model is recognised without any network request; the result is C(changed=false) and no file bytes
    are transferred."
  - "Before any download the bytes still missing (files absent, minus what partial files already hold) plus
    O(min_free_bytes_margin) are compared with the free space of O(local_dir)'s filesystem; when they do not fit
    the module fails with both numbers and downloads nothing."
  - "Files are fetched in parallel (O(max_workers)). Each one is written to
    C(<local_dir>/.cache/kpro-hf/incomplete/<path>.incomplete); an interrupted run (network cut, killed process,
    Ansible timeout) leaves it there and the next run continues it with an HTTP C(Range) request, so completed
    bytes are never fetched twice. (huggingface_hub's own download deletes its per-process temporary file on
    failure and cannot resume across processes, so the transfer loop is done here, with huggingface_hub's
    C(hf_hub_url), C(get_hf_file_metadata) and HTTP session.)"
  - "Progress is written about once a second to O(progress_file) (JSON: bytes done/total, percent, rate, ETA,
    files in flight), so an operator can watch a long download that runs under C(async)."
  - "A branch or tag in O(revision) is resolved to its commit, reported in RV(resolved_revision), and warned about:
    pin the commit sha so that every host gets the same bytes."
  - "Sources (O(sources), tried in order per file): a peer's model directory over SSH, a mirror directory, the hub.
    Trust stays in one place: every file, whatever its source, is checked against the size and checksum of the hub's
    listing for the pinned commit (or of O(manifest)) before it is moved into place; a peer is never asked for hashes.
    A file that does not verify is fetched again from the next source; a transfer cut short continues from the next
    source at the same byte. RV(bytes_by_source) says how many bytes came from each."
  - "A peer is read with the target's OpenSSH client (C(ssh)): the SGLang venv has no paramiko, and OpenSSH
    multiplexing gives one handshake per peer (a ControlMaster in a private directory, closed at the end) and a cheap
    channel per file. Host keys are checked against O(ssh_known_hosts_file) only (no trust on first use)."
  - Needs the Python library C(huggingface_hub) on the target when the hub must be contacted (the SGLang venv has
    it; set C(ansible_python_interpreter) to that venv's python).
author:
  - kpro.gpu_serving developers (!UNKNOWN)
requirements:
  - huggingface_hub (any version with C(HfApi.list_repo_tree); 0.2x and 1.x/2.x are supported)
options:
  repo_id:
    description: The model repository, for example C(Qwen/Qwen3.6-27B).
    type: str
    required: true
  revision:
    description:
      - A 40-hex commit sha (pinned; recommended), or a branch or tag that is resolved to its current commit
        (reported in RV(resolved_revision), with a warning).
    type: str
    required: true
  local_dir:
    description:
      - The model directory (what SGLang's C(--model-path) points to). Created when missing.
      - State (listing cache, checksum markers, partial files, the default progress file) is kept under
        C(<local_dir>/.cache/).
    type: path
    required: true
  root:
    version_added: "0.2.0"
    description:
      - "The models' root. O(local_dir)'s real path (symlinks resolved on the target) must lie under this directory's
        real path, and never under a system directory (C(/etc), C(/usr), C(/lib*), C(/run), ...): a model directory
        that leads elsewhere is refused before anything is written. Omitted, only the system directories are refused."
      - O(local_dir) with a C(..) component is refused too.
    type: path
  endpoint:
    description:
      - The hub's base URL. Defaults to the C(HF_ENDPOINT) environment variable of the target, else
        U(https://huggingface.co). The lab's hub is C(http://10.213.5.1:18602).
    type: str
  token:
    description:
      - A Hugging Face access token (keep it in Ansible Vault). Sent only to the hub, never to the CDN the hub
        redirects LFS downloads to, and never printed.
      - Defaults to the C(HF_TOKEN) environment variable of the target; without either, huggingface_hub's own
        stored token (if any) is used.
      - "With C(async) do not use it: Ansible writes a background module's arguments to a file on the target that
        stays there for the whole run. Use O(token_file)."
    type: str
  token_file:
    version_added: "0.2.0"
    description:
      - A file on the target holding the token; the module reads it and removes it as it starts, so with C(async)
        the token is on the target's disk only until the job starts (the role writes it to C(/run), a tmpfs, through
        a module's standard input, so it is in no command line). Mutually exclusive with O(token).
    type: path
  allow_patterns:
    description: Only files matching one of these glob patterns (fnmatch on the repository path; C(dir/) means everything below).
    type: list
    elements: str
  ignore_patterns:
    description: Leave out files matching one of these glob patterns.
    type: list
    elements: str
  max_workers:
    description: How many files are downloaded at the same time.
    type: int
    default: 8
  min_free_bytes_margin:
    description: Bytes that must remain free on O(local_dir)'s filesystem after the download (the preflight adds them).
    type: int
    default: 0
  verify:
    description:
      - Check checksums (sha256 of LFS files, git blob sha1 of the others, both as listed by the hub). Sizes are always checked.
      - With V(false) a present file of the right size counts as complete.
    type: bool
    default: true
  timeout:
    description: Seconds to wait for the hub (connect and each read).
    type: float
    default: 30
  retries:
    description:
      - How often a stalled transfer of one file is retried (resuming from the last byte received) before the
        module gives up on that file. Any byte received resets the count.
    type: int
    default: 3
  progress_file:
    description: Where the progress JSON is written. Default C(<local_dir>/.cache/kpro-progress.json).
    type: path
  verify_full:
    version_added: "0.2.0"
    description:
      - "Hash every file again, ignoring the checksums remembered from earlier runs (implies O(verify)). Slow: it reads
        the whole model. The remembered checksums are already void for a file whose size, inode, mtime or ctime
        changed (a write in place changes ctime, which C(touch) cannot set back)."
    type: bool
    default: false
  lock_timeout:
    version_added: "0.2.0"
    description:
      - "One download per O(local_dir): a run takes C(<local_dir>/.cache/kpro-hf/download.lock) (C(flock), the holder's
        PID in it) before it looks at any file, and waits while another live process holds it (an earlier run whose
        controller was killed goes on in the background). Seconds to wait before failing with phase C(model_locked)."
      - The lock is dropped by the kernel when its holder dies. C(flock) must work on the filesystem (local disks do;
        some network filesystems silently grant it to everyone).
    type: int
    default: 14400
  keep_revision:
    version_added: "0.2.0"
    description:
      - "The model revision of the last deployment that passed the gate (the role reads it from the deployment record of
        M(kpro.gpu_serving.sglang_deployment)); V(\"\") = none. When it differs from the downloaded O(revision), its files
        are kept for a rollback: hard-linked into C(<local_dir>/.cache/kpro-revisions/<commit>/) before the download
        (no bytes copied; the download then replaces the paths in O(local_dir)), when the bytes still to download plus
        O(min_free_bytes_margin) fit in the free space (room for both). When they fit only without it, the previous
        revision's files that the download replaces are removed first, with a warning that a rollback to it must
        download it again. One previous revision is kept; an older kept one is removed when another is kept."
      - A commit sha names the revision; a branch or tag means the commit O(local_dir) holds now (its listing cached
        and every file verified). RV(previous_revision) says which and what was done (in check mode, what would be).
    type: str
    default: ""
  deployment_unit:
    version_added: "0.2.0"
    description:
      - "The SGLang unit (for example V(sglang.service)) whose deployment record (M(kpro.gpu_serving.sglang_deployment),
        in its default C(state_dir)) names the last good model revision, used as O(keep_revision). Read here on the
        target: the record also holds the server's environment, which is never handed to the controller.
        V(\"\") = none."
    type: str
    default: ""
  job:
    version_added: "0.2.0"
    description:
      - "Watch mode. The C(results_file) of an C(async) run of this module (C(poll=0)); nothing is downloaded. Returns
        the job's result once it finished (and removes the job file), else C(finished=false) while a live process holds
        the directory lock, and fails with phase C(download_died) when the job is not finished and no process holds
        the lock (after a 30 s start grace): a download killed with its wrapper (OOM killer, container restart) is
        noticed at the next poll instead of at the C(async) timeout."
    type: path
  sources:
    description:
      - "Where the files come from, tried in order for each file (a source that lacks a file, or has it with another
        size, is skipped for it). V({type: hub}): the hub (O(endpoint)). V({type: mirror, path: DIR}): a directory on the
        target laid out as the model directory (an NFS mount, a copy on another disk). V({type: peer, ssh: USER@HOST,
        path: DIR, port: 22, vmid: N, bwlimit: 0}): another machine's model directory over SSH; with C(vmid) the remote
        commands run as C(pct exec N --) on that Proxmox host (a peer container); C(bwlimit) caps the bytes per second
        read from that peer, all its files together (0 = none), so a host still serving keeps its link."
      - "The peer's listing is read once (C(find DIR -type f)), each file with C(tail -c +OFFSET), so a partial file
        resumes. Sizes and checksums come from the hub's listing or O(manifest), never from a peer or mirror. An
        unreachable peer is warned about and serves nothing. In check mode no peer is contacted."
    type: list
    elements: dict
    default: [{type: hub}]
    version_added: "0.3.0"
  manifest:
    description:
      - "The files of O(revision) as the operator pinned them (a list of V({path, size, sha256}) or V({path, size, oid}),
        oid being the git blob sha1 of a file not in LFS), used instead of the hub's listing: the hub is then asked for
        no metadata (a fully offline site). O(revision) must be a commit sha. Checked before anything is written."
    type: list
    elements: dict
    version_added: "0.3.0"
  ssh_key_file:
    description:
      - "A file on the target holding the private key for the peers (required with a peer). As O(token_file): the module
        moves it into its own private 0600 file (in a 0700 directory under C(/run)) and removes this file as it starts;
        the private copy is removed when the run ends. The key's text is scrubbed from every message."
    type: path
    version_added: "0.3.0"
  ssh_known_hosts_file:
    description:
      - "The known_hosts file that the peers' host keys are checked against (required with a peer;
        C(StrictHostKeyChecking=yes): a peer whose key is not in it is refused)."
    type: path
    version_added: "0.3.0"
attributes:
  check_mode:
    support: full
    description: Reports what would be downloaded (and runs the disk preflight) without writing anything.
  diff_mode:
    support: none
    description: The module downloads files; it does not report diffs.
notes:
  - "Run long downloads with C(async) and C(poll) (see EXAMPLES): a 55 GB model takes longer than an SSH
    connection or a default task timeout may last. If the task is interrupted, run it again: it resumes."
  - "Files in O(local_dir) that are not in the listing are left alone."
  - "O(local_dir) must be absolute and without whitespace; anything else is refused (phase C(model_input)) before
    anything is written."
"""

EXAMPLES = r"""
- name: Download Qwen3.6-27B at a pinned commit into the model directory
  kpro.gpu_serving.hf_model:
    repo_id: Qwen/Qwen3.6-27B
    revision: 6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5
    local_dir: /srv/models/Qwen3.6-27B
    token: "{{ vault_hf_token }}"
    ignore_patterns: ["*.md", ".gitattributes"]
  vars:
    ansible_python_interpreter: /opt/sglang/venv/bin/python

# A long download: run it in the background, poll every 30 s for up to 4 h.
# Watch it from another shell with: watch cat /srv/models/Qwen3.6-27B/.cache/kpro-progress.json
- name: Download the model (async)
  kpro.gpu_serving.hf_model:
    repo_id: Qwen/Qwen3.6-27B
    revision: 6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5
    local_dir: /srv/models/Qwen3.6-27B
    token: "{{ vault_hf_token }}"
    max_workers: 8
    min_free_bytes_margin: "{{ 10 * 1024 ** 3 }}"
  async: 14400
  poll: 30
  register: model

# The model from the old host's container first (kpro6's CT 131, through its Proxmox host), the hub for anything
# it lacks or that does not verify. The role writes the key to ssh_key_file through the module's stdin, as the token.
- name: Copy the model from a peer, then the hub
  kpro.gpu_serving.hf_model:
    repo_id: Qwen/Qwen3.6-27B
    revision: 6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5
    local_dir: /srv/models/Qwen3.6-27B
    token_file: /run/kpro-hf-token
    sources:
      - {type: peer, ssh: root@10.213.5.3, vmid: 131, path: /srv/models/Qwen3.6-27B, bwlimit: 0}
      - {type: hub}
    ssh_key_file: /run/kpro-model-peer-key
    ssh_known_hosts_file: /etc/kpro/model_peers_known_hosts
  register: model
- ansible.builtin.debug:
    msg: "{{ model.bytes_by_source }}"

- name: Against the lab's hub, resolving a branch (warns; pin the reported sha afterwards)
  kpro.gpu_serving.hf_model:
    repo_id: Qwen/Qwen3.6-27B
    revision: main
    local_dir: /srv/models/Qwen3.6-27B
    endpoint: http://10.213.5.1:18602
  register: model
- ansible.builtin.debug:
    msg: "pin revision: {{ model.resolved_revision }}"
"""

RETURN = r"""
extends_documentation_fragment:
  - kpro.gpu_serving.failure
resolved_revision:
  description: The commit sha the files come from.
  returned: always
  type: str
  sample: 6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5
pinned:
  description: Whether O(revision) was a commit sha.
  returned: always
  type: bool
path:
  description: The model directory.
  returned: always
  type: str
  sample: /srv/models/Qwen3.6-27B
files:
  description: Number of files selected from the listing.
  returned: always
  type: int
  sample: 24
bytes_total:
  description: Total size of the selected files, as listed by the hub.
  returned: always
  type: int
bytes_needed:
  description: Bytes that were (or in check mode would be) still to download before this run.
  returned: always
  type: int
bytes_downloaded:
  description: Bytes received by this run, from all sources (0 when the model was complete); see RV(bytes_by_source).
  returned: always
  type: int
free_bytes:
  description: Free bytes on O(local_dir)'s filesystem before the download (only when something was to download).
  returned: when something was to download
  type: int
verified:
  description: Number of selected files whose checksum is verified (now or by a still valid earlier check).
  returned: always
  type: int
files_complete:
  description: Number of selected files that were already complete before this run.
  returned: always
  type: int
downloaded:
  description: Repository paths downloaded (or, in check mode, to download) by this run; resumed files included.
  returned: always
  type: list
  elements: str
resumed:
  description: Repository paths whose download continued a partial file of an earlier run.
  returned: always
  type: list
  elements: str
bytes_by_source:
  description: Bytes written by this run from each source (its label, e.g. C(hub), C(mirror:/mnt/m), C(peer:root@10.213.5.3:131:/srv/models/Q)).
  returned: always (empty in check mode)
  type: dict
  sample: {"peer:root@10.213.5.3:131:/srv/models/Qwen3.6-27B": 55600000000}
  version_added: "0.3.0"
files_by_source:
  description: The repository paths fetched by this run, by the label of the source that served them.
  returned: always (empty in check mode)
  type: dict
  version_added: "0.3.0"
fallbacks:
  description:
    - "Each file that one source did not deliver: C(path), C(from) and C(to) (source labels), C(reason) (C(mismatch): its
      bytes did not match the listing, fetched again from byte 0; C(transport): the transfer failed, the next source
      continued at the same byte) and C(error). Each is also warned about."
  returned: always
  type: list
  elements: dict
  version_added: "0.3.0"
offline:
  description: True when completeness was decided from the cached listing without contacting the hub.
  returned: always
  type: bool
progress_file:
  description: The progress JSON file.
  returned: always
  type: str
previous_revision:
  version_added: "0.2.0"
  description:
    - "What happens to the revision of O(keep_revision): C(action) (C(none): nothing to keep; C(kept): kept already;
      C(keep): kept now; C(remove): not enough disk for both, its replaced files removed before the download;
      C(missing): its files are not here; C(no_space): the download does not fit even without it), C(previous) (its
      commit), C(message) (one line for the operator), C(reclaim) (bytes of its files the download replaces), C(path)
      and C(dropped) (the kept directory and the older kept revisions removed, after a keep)."
  returned: always (except in watch mode while the download runs)
  type: dict
  sample: {action: keep, previous: 0123456789abcdef0123456789abcdef01234567, reclaim: 1073741824,
           message: "previous model revision 0123... is kept beside 89ab... (...): a rollback can use it"}
restored_from_kept:
  version_added: "0.2.0"
  description:
    - Repository paths brought back from the kept copy of O(revision) (C(<local_dir>/.cache/kpro-revisions/<commit>/),
      a revision kept for a rollback and asked for again), as hard links, instead of being downloaded (in check mode,
      that would be). Only for a commit sha in O(revision); a kept file changed since it was kept is checked and
      downloaded as usual.
  returned: when a kept copy was used
  type: list
  elements: str
finished:
  version_added: "0.2.0"
  description: In watch mode (O(job)), false while the background download still runs.
  returned: in watch mode
  type: bool
progress:
  version_added: "0.2.0"
  description:
    - In watch mode while the download runs, one line of progress (bytes, percent, rate, files, time left). The callback
      C(kpro.gpu_serving.progress) prints it on each poll at default verbosity.
  returned: in watch mode, while the download runs
  type: str
  sample: 12.3 GiB of 51.2 GiB (24.0%), 98.4 MiB/s, 3 of 15 files, about 405 s left
"""

import os

from ansible.module_utils.basic import AnsibleModule, env_fallback

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import deployment as dp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf_download as hd
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import model_sources as ms
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import names
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail as failure_fail


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo_id=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            local_dir=dict(type="path", required=True),
            root=dict(type="path"),
            endpoint=dict(type="str", fallback=(env_fallback, ["HF_ENDPOINT"])),
            token=dict(type="str", no_log=True, fallback=(env_fallback, ["HF_TOKEN"])),
            token_file=dict(type="path"),
            allow_patterns=dict(type="list", elements="str"),
            ignore_patterns=dict(type="list", elements="str"),
            max_workers=dict(type="int", default=8),
            min_free_bytes_margin=dict(type="int", default=0),
            verify=dict(type="bool", default=True),
            verify_full=dict(type="bool", default=False),
            timeout=dict(type="float", default=30),
            retries=dict(type="int", default=3),
            progress_file=dict(type="path"),
            lock_timeout=dict(type="int", default=14400),
            keep_revision=dict(type="str", default=""),
            deployment_unit=dict(type="str", default=""),
            job=dict(type="path"),
            sources=dict(type="list", elements="dict", default=[{"type": "hub"}]), manifest=dict(type="list", elements="dict"),
            ssh_key_file=dict(type="path"), ssh_known_hosts_file=dict(type="path"),
        ),
        mutually_exclusive=[("token", "token_file"), ("keep_revision", "deployment_unit")],
        supports_check_mode=True,
    )
    p = module.params
    local_dir, lock, identity = p["local_dir"], None, None
    try:
        # first: the token and key files must not outlive this process, whatever fails next
        token = hf.read_token_file(p["token_file"]) if p["token_file"] and not p["job"] else (p["token"] or None)
        identity = ms.SshIdentity.take(p)
        ms.require_valid(p, module.check_mode)  # before anything is written: local_dir, sources, manifest, ssh options
        # before anything is read or written: the record's file is named after the unit, the model goes to local_dir
        wrong = (names.unit_name_problem(p["deployment_unit"], "deployment_unit") if p["deployment_unit"] else None) or (
            names.model_dir_problem(p["local_dir"], p["root"]))
        if wrong:
            raise wrong
        if p["deployment_unit"]:
            p["keep_revision"] = dp.good_model_revision(p["deployment_unit"])
        local_dir = os.path.normpath(p["local_dir"])
        progress_file = p["progress_file"] or os.path.join(local_dir, hf.PROGRESS_FILE)
        if p["job"]:
            result = hd.watch(module, p, local_dir, progress_file)
        else:
            lock = hd.lock(module, local_dir, p["lock_timeout"])
            result = hd.run(module, p, token, local_dir, progress_file, identity)
    except Failure as f:
        failure_fail(module, f, path=local_dir)
    else:
        module.exit_json(**result)
    finally:
        if lock is not None:
            lock.release()
        if identity is not None:
            identity.cleanup()


if __name__ == "__main__":
    main()
