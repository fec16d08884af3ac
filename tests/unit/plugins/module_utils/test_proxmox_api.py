# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import json

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa

UPID = "UPID:kpro5:0001A2B3:00C0FFEE:6650A1B2:vzstart:129:root@pam!ansible:"


class FakeClock(object):
    def __init__(self):
        self.t = 1000.0
        self.sleeps = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.sleeps.append(s)
        self.t += s


class Res(object):
    """A chainable stand-in for proxmoxer's ProxmoxResource that records calls."""

    def __init__(self, api, path):
        self._api = api
        self._path = path

    def __getattr__(self, name):
        if name in ("get", "post", "put", "delete"):
            return lambda *a, **kw: self._api.handle(name, self._path, kw)
        return Res(self._api, self._path + "/" + name)

    def __call__(self, ident):
        return Res(self._api, "%s/%s" % (self._path, ident))


class FakeApi(object):
    def __init__(self, statuses=None, posts=None):
        self.calls = []
        self.statuses = list(statuses or [])
        self.posts = posts or {}
        self.ct_status = "running"

    def __getattr__(self, name):
        return Res(self, name)

    def handle(self, method, path, kw):
        self.calls.append((method, path, kw))
        if path.endswith("/status") and "/tasks/" in path:
            return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        if path.endswith("/log"):
            return [{"n": 1, "t": "starting"}, {"n": 2, "t": "TASK ERROR: boom"}]
        if path.endswith("/status/current"):
            return {"status": self.ct_status, "vmid": 129}
        if path == "cluster/resources":
            return [{"vmid": 101, "type": "qemu", "node": "kpro5"}, {"vmid": 129, "type": "lxc", "node": "kpro5"}]
        if method == "post":
            return self.posts.get(path.rsplit("/", 1)[-1], UPID)
        return None


def test_wait_task_ok_and_warnings():
    clock = FakeClock()
    api = FakeApi([{"status": "running"}, {"status": "running"}, {"status": "stopped", "exitstatus": "WARNINGS: 2"}])
    st = pa.wait_task(api, "x", UPID, 30, clock=clock, sleep=clock.sleep)
    assert st["exitstatus"] == "WARNINGS: 2"
    # the node comes from the UPID, not the argument
    assert api.calls[0][1] == "nodes/kpro5/tasks/%s/status" % UPID
    assert clock.sleeps == [1.0, 1.0]


def test_wait_task_deadline_is_explicit():
    clock = FakeClock()
    api = FakeApi([{"status": "running"}])
    with pytest.raises(pa.ProxmoxTaskTimeout) as e:
        pa.wait_task(api, "kpro5", UPID, 5, poll_interval=2, clock=clock, sleep=clock.sleep)
    assert "still running after 5s" in str(e.value)
    assert clock.t - 1000.0 <= 5.0 + 1e-9  # never sleeps past the deadline
    assert sum(clock.sleeps) == pytest.approx(5.0)


def test_wait_task_error_includes_log():
    clock = FakeClock()
    api = FakeApi([{"status": "stopped", "exitstatus": "startup for container '129' failed"}])
    with pytest.raises(pa.ProxmoxTaskError) as e:
        pa.wait_task(api, "kpro5", UPID, 5, clock=clock, sleep=clock.sleep)
    assert "startup for container '129' failed" in str(e.value) and "TASK ERROR: boom" in str(e.value)


def test_task_ok():
    assert pa.task_ok("OK") and pa.task_ok("WARNINGS: 1")
    assert not pa.task_ok("command 'lxc-start' failed") and not pa.task_ok(None)


def test_connect_https_token_passes_timeout_and_verify():
    seen = {}

    def factory(host=None, **kw):
        seen.update(kw, host=host)
        return FakeApi()
    s = pa.connect(dict(api_backend="https", api_host="10.0.0.5", api_port=8006, api_user="root@pam",
                        api_token_id="root@pam!ansible", api_token_secret="s3cret", validate_certs=True,
                        ca_path="/etc/ca.pem", api_timeout=30), api_factory=factory)
    assert seen["timeout"] == 30 and seen["verify_ssl"] == "/etc/ca.pem"
    assert seen["user"] == "root@pam" and seen["token_name"] == "ansible" and seen["token_value"] == "s3cret"
    assert s.is_token and s.authuser == "root@pam!ansible"


def test_https_requests_get_the_timeout_and_pve_errors():
    """What _harden_https adds to a proxmoxer 1.x-like API: the timeout on each request, the body's errors."""
    class Resp(object):
        status_code = 400
        content = b'{"data":null,"errors":{"dev1":"invalid format"}}'
    sent = []

    class HttpSession(object):
        def request(self, method, url, **kw):
            sent.append((method, url, kw))
            return Resp()

    class Serializer(object):  # 1.2.0 https.py:153-157: body["data"], no loads_errors
        def loads(self, response):
            return json.loads(response.content)["data"]

    class Api(object):
        _store = {"session": HttpSession(), "serializer": Serializer()}
    s = pa.connect(dict(api_backend="https", api_host="h", api_password="pw", api_timeout=7),
                   api_factory=lambda host, **kw: Api())
    store = s.api._store
    store["session"].request("GET", "u", params=None)
    store["session"].request("GET", "u", timeout=3)
    assert sent == [("GET", "u", {"params": None, "timeout": 7}), ("GET", "u", {"timeout": 3})]
    assert store["serializer"].loads(Resp()) == {"errors": {"dev1": "invalid format"}}


def test_connect_https_verify_default_true_and_password():
    seen = {}

    def factory(host=None, **kw):
        seen.update(kw)
        return FakeApi()
    s = pa.connect(dict(api_backend="https", api_host="h", api_password="pw"), api_factory=factory)
    assert seen["verify_ssl"] is True and seen["timeout"] == 30 and seen["password"] == "pw"
    assert not s.is_token and s.authuser == "root@pam"


class Pvesh(object):
    """A pvesh runner: records argv, answers (stdout, stderr, exit status) in turn."""

    def __init__(self, *answers):
        self.argvs = []
        self.answers = list(answers)

    def __call__(self, argv):
        self.argvs.append(argv)
        return self.answers.pop(0)


def test_connect_local_runs_pvesh_and_reads_the_last_json():
    # a worker runs in the foreground under pvesh: its log comes before the UPID (PVE bug 4333)
    run = Pvesh(("starting CT 129\nTASK OK\n\"%s\"\n" % UPID, "", 0), ("", "", 0))
    s = pa.connect(dict(api_backend="local", api_timeout=60), cli_runner=run)
    assert s.authuser == "root@pam" and not s.is_token and s.timeout == 60
    assert ct_api(s).status.shutdown.post(timeout=30, forceStop=True, skiplock=None) == UPID
    assert ct_api(s).config.put(dev0="/dev/nvidia0,mode=0666", delete="dev5") is None
    assert run.argvs == [
        ["pvesh", "create", "/nodes/kpro5/lxc/129/status/shutdown", "-timeout", "30", "-forceStop", "1",
         "--output-format", "json"],
        ["pvesh", "set", "/nodes/kpro5/lxc/129/config", "-dev0", "/dev/nvidia0,mode=0666", "-delete", "dev5",
         "--output-format", "json"]]


def ct_api(session):
    return session.api.nodes("kpro5").lxc(129)


def test_pvesh_errors_keep_code_and_message():
    run = Pvesh(("", "400 Parameter verification failed.\ndev1: invalid format - /tmp/x is not a valid device path\n", 255),
                ("", "CT 129 already running\n", 255),
                ("starting CT 129\n", "startup for container '129' failed\n", 0))
    s = pa.connect(dict(api_backend="local"), cli_runner=run)
    with pytest.raises(pa.ResourceException) as e:
        ct_api(s).config.put(dev1="/tmp/x")
    assert e.value.status_code == 400 and "dev1: invalid format" in e.value.content
    msg = pa.describe_error(e.value)
    assert msg.startswith("calling the PVE API failed: HTTP 400 Bad Request: 400 Parameter verification failed.")
    with pytest.raises(pa.ResourceException) as e:
        ct_api(s).status.start.post()
    assert e.value.status_code == 500 and e.value.content == "CT 129 already running"
    # exit 0 with stderr and no JSON: a start whose output is not a UPID is an error, not a task to wait on
    with pytest.raises(pa.ProxmoxApiError, match=r"start CT 129 returned \{'errors': 'starting CT 129\\n'\} instead"):
        pa.ct_start(s, "kpro5", 129)


def test_connect_ssh_passes_the_connection_options(monkeypatch):
    seen = []
    monkeypatch.setattr(pa, "_ssh_client", lambda params, host, timeout: seen.append((params, host, timeout)) or "client")
    monkeypatch.setattr(pa, "_ssh_runner", lambda client, timeout: Pvesh(('{"status":"running"}', "", 0)))
    s = pa.connect(dict(api_backend="ssh_paramiko", api_host="h", ssh_private_key_file="/k", ssh_host_key_checking=False))
    assert seen[0][1:] == ("h", 30) and seen[0][0]["ssh_private_key_file"] == "/k"
    assert s.authuser == "root@pam" and s.host == "h" and pa.ct_status(s, "kpro5", 129) == {"status": "running"}
    with pytest.raises(pa.ProxmoxApiError, match="api_host is required for api_backend=ssh_paramiko"):
        pa.connect(dict(api_backend="ssh_paramiko"))


def test_connect_without_credentials():
    with pytest.raises(pa.ProxmoxApiError, match="no credentials"):
        pa.connect(dict(api_backend="https", api_host="h"), api_factory=lambda *a, **k: None)
    with pytest.raises(pa.ProxmoxApiError, match="api_host is required"):
        pa.connect(dict(api_backend="https"), api_factory=lambda *a, **k: None)


def test_set_devn_refuses_token_up_front():
    api = FakeApi()
    s = pa.Session(api, "https", "root@pam", token_id="ansible")
    with pytest.raises(pa.ProxmoxApiError) as e:
        pa.set_devn(s, "kpro5", 129, {"dev0": "/dev/nvidia0,mode=0666"})
    msg = str(e.value)
    assert "devN can only be changed by root@pam; an API token (root@pam!ansible) is refused by PVE" in msg
    assert "backend=ssh_paramiko/local" in msg and "method=lxc_raw" in msg
    assert api.calls == []  # nothing sent


def test_set_devn_root_password_puts_config():
    api = FakeApi()
    s = pa.Session(api, "https", "root@pam")
    pa.set_devn(s, "kpro5", 129, {"dev0": "/dev/nvidia0,mode=0666"}, ["dev5"])
    assert api.calls == [("put", "nodes/kpro5/lxc/129/config", {"dev0": "/dev/nvidia0,mode=0666", "delete": "dev5"})]


def test_restart_running_and_stopped():
    api = FakeApi([{"status": "stopped", "exitstatus": "OK"}])
    s = pa.Session(api, "https", "root@pam", token_id="ansible")
    tasks = pa.ct_restart(s, "kpro5", 129, task_timeout=10, shutdown_timeout=30)
    assert len(tasks) == 2
    posts = [(p, kw) for m, p, kw in api.calls if m == "post"]
    assert posts == [("nodes/kpro5/lxc/129/status/shutdown", {"timeout": 30, "forceStop": 1}),
                     ("nodes/kpro5/lxc/129/status/start", {})]
    api.ct_status = "stopped"
    api.calls = []
    assert pa.ct_restart(s, "kpro5", 129) == []
    assert [c for c in api.calls if c[0] == "post"] == []


def test_find_node():
    s = pa.Session(FakeApi(), "https", "root@pam")
    assert pa.find_node(s, 129) == "kpro5"
    with pytest.raises(pa.ProxmoxApiError, match="not a container"):
        pa.find_node(s, 101)
    with pytest.raises(pa.ProxmoxApiError, match="not known"):
        pa.find_node(s, 555)


def test_describe_error_maps_pve_messages():
    exc = pa.ResourceException(403, "Forbidden", "configuring device passthrough is only allowed for root@pam")
    assert "reserved for root@pam" in pa.describe_error(exc)
    exc = pa.ResourceException(500, "Internal Server Error", "Device /dev/nvidia-uvm does not exist")
    assert "nvidia-modprobe" in pa.describe_error(exc)
    exc = pa.ResourceException(500, "Internal Server Error", "CT is locked (backup)")
    assert "pct unlock" in pa.describe_error(exc)
    assert "api_timeout" in pa.describe_error(Exception("Read timed out. (read timeout=30)"))
    assert "ca_path" in pa.describe_error(Exception("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"))


def test_api_argument_spec_secrets_no_log():
    spec = pa.api_argument_spec()
    assert spec["api_token_secret"]["no_log"] and spec["api_password"]["no_log"]
    assert spec["validate_certs"]["default"] is True and spec["api_timeout"]["default"] == 30


CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_install_ca_writes_dir_and_file_then_is_a_noop(tmp_path):
    dest = tmp_path / "etc" / "kpro-gpu-serving" / "pve-ca.pem"
    params = dict(ca_content=CA, ca_path=str(dest))
    first = pa.install_ca(params, False, str(tmp_path / "tmp"))
    assert first["changed"] and first["path"] == str(dest) and dest.read_text() == CA
    assert (dest.stat().st_mode & 0o777) == 0o644 and (dest.parent.stat().st_mode & 0o777) == 0o755
    assert first["diff"] == dict(before="", after=CA, before_header=str(dest), after_header=str(dest))
    assert pa.install_ca(params, False, str(tmp_path)) == dict(changed=False, path=str(dest), diff=None)
    dest.chmod(0o600)  # a mode other than the copy task's is a change, as it was for the copy
    assert pa.install_ca(params, False, str(tmp_path))["changed"] and (dest.stat().st_mode & 0o777) == 0o644


def test_install_ca_check_mode_verifies_against_a_copy_and_writes_nothing(tmp_path):
    dest = tmp_path / "pve-ca.pem"
    dest.write_text("old\n")
    tmp = tmp_path / "moduletmp"
    tmp.mkdir()
    got = pa.install_ca(dict(ca_content=CA, ca_path=str(dest)), True, str(tmp))
    assert got["changed"] and dest.read_text() == "old\n"
    assert got["path"] == str(tmp / "pve-ca.pem") and (tmp / "pve-ca.pem").read_text() == CA
    assert got["diff"]["before"] == "old\n" and got["diff"]["after"] == CA


def test_install_ca_without_content_uses_ca_path_and_needs_a_path_with_content(tmp_path):
    assert pa.install_ca(dict(ca_path="/etc/pve/pve-root-ca.pem"), False, str(tmp_path)) == dict(
        changed=False, path="/etc/pve/pve-root-ca.pem", diff=None)
    with pytest.raises(pa.ProxmoxApiError, match="ca_path"):
        pa.install_ca(dict(ca_content=CA), False, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_install_ca_unwritable_is_a_failure_not_a_traceback(tmp_path):
    blocker = tmp_path / "etc"
    blocker.write_text("a file where the directory should be\n")
    with pytest.raises(pa.ProxmoxApiError, match="cannot put the CA at .*etc/kpro/pve-ca.pem") as e:
        pa.install_ca(dict(ca_content=CA, ca_path=str(blocker / "kpro" / "pve-ca.pem")), False, str(tmp_path))
    assert "writable" in e.value.remedy and blocker.read_text() == "a file where the directory should be\n"
