"""The lab's controller-side services (tests/lab/services/labsvc.py) on 127.0.0.1 with free ports: no root, no lab."""

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
import zipfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LABSVC = os.path.join(REPO, "tests", "lab", "services", "labsvc.py")
SYSTEM_PYTHON = "/usr/bin/python3"


def _labsvc():
    spec = importlib.util.spec_from_file_location("kpgs_labsvc", LABSVC)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_wheel(dest, name="kpgs-probe", version="1.2.3", requires_python=">=3.9"):
    """A minimal, valid pure-python wheel (no build backend needed)."""
    dist = name.replace("-", "_")
    fn = os.path.join(str(dest), "%s-%s-py3-none-any.whl" % (dist, version))
    info = "%s-%s.dist-info" % (dist, version)
    files = {
        "%s/__init__.py" % dist: "VERSION = %r\n" % version,
        "%s/METADATA" % info: "Metadata-Version: 2.1\nName: %s\nVersion: %s\nRequires-Python: %s\n\n" % (name, version, requires_python),
        "%s/WHEEL" % info: "Wheel-Version: 1.0\nGenerator: kpgs-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(fn, "w") as z:
        for arc, text in files.items():
            data = text.encode()
            z.writestr(arc, data)
            digest = hashlib.sha256(data).digest()
            import base64
            record.append("%s,sha256=%s,%d" % (arc, base64.urlsafe_b64encode(digest).rstrip(b"=").decode(), len(data)))
        record.append("%s/RECORD,," % info)
        z.writestr("%s/RECORD" % info, "\n".join(record) + "\n")
    return fn


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    base = tmp_path_factory.mktemp("labsvc")
    blobs = base / "blobs"
    blobs.mkdir()
    (blobs / "NVIDIA-Linux-x86_64-580.126.09.run").write_bytes(os.urandom(300000))
    wheels = base / "wheels"
    wheels.mkdir()
    build_wheel(wheels)
    state = base / "state"
    running = _labsvc().start(["--addr", "127.0.0.1", "--state-dir", str(state), "--files-port", "0", "--files-dir", str(blobs),
                               "--index-port", "0", "--index-dir", str(wheels), "--hub-port", "0", "--hub-shard-size", "1MiB"])
    try:
        yield {"urls": running.urls, "blobs": blobs, "wheels": wheels, "state": state, "base": base, "running": running}
    finally:
        running.stop()
    assert not (state / "labsvc.pid").exists()


def get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, dict(r.headers), r.read()


def test_ready_and_pidfile(svc):
    urls = svc["urls"]
    assert set(urls) >= {"pid", "files", "index", "hub", "hub_cdn", "hub_commit", "hub_repo"}
    assert (svc["state"] / "labsvc.pid").read_text().strip() == str(urls["pid"]) == str(svc["running"].pid)
    assert json.loads((svc["state"] / "labsvc.json").read_text()) == urls


def test_file_server_sha256_sidecar_and_range(svc):
    run = svc["blobs"] / "NVIDIA-Linux-x86_64-580.126.09.run"
    data = run.read_bytes()
    status, headers, body = get(svc["urls"]["files"] + "/" + run.name)
    assert status == 200 and body == data and headers["Content-Length"] == str(len(data))
    status, _h, body = get(svc["urls"]["files"] + "/" + run.name + ".sha256")
    assert body.decode() == "%s  %s\n" % (hashlib.sha256(data).hexdigest(), run.name)
    status, headers, body = get(svc["urls"]["files"] + "/" + run.name, {"Range": "bytes=1000-1999"})
    assert status == 206 and body == data[1000:2000] and headers["Content-Range"] == "bytes 1000-1999/%d" % len(data)
    with pytest.raises(urllib.error.HTTPError) as e:
        get(svc["urls"]["files"] + "/../../etc/passwd")
    assert e.value.code in (403, 404)
    log = [json.loads(line) for line in (svc["state"] / "files-access.jsonl").read_text().splitlines()]
    assert any(e["file"] == run.name and e["bytes"] == len(data) for e in log)


def test_index_pages(svc):
    status, headers, body = get(svc["urls"]["index"] + "kpgs-probe/")
    page = body.decode()
    whl = os.listdir(str(svc["wheels"]))[0]
    digest = hashlib.sha256((svc["wheels"] / whl).read_bytes()).hexdigest()
    assert "#sha256=%s" % digest in page and 'data-requires-python="&gt;=3.9"' in page
    status, headers, body = get(svc["urls"]["index"] + "kpgs-probe/", {"Accept": "application/vnd.pypi.simple.v1+json"})
    doc = json.loads(body)
    assert headers["Content-Type"] == "application/vnd.pypi.simple.v1+json"
    assert doc["files"][0]["hashes"]["sha256"] == digest and doc["files"][0]["requires-python"] == ">=3.9"
    # non-normalized names redirect to the normalized page (urllib follows it)
    status, _h, body = get(svc["urls"]["index"] + "KPGS_Probe/")
    assert status == 200 and whl in body.decode()


@pytest.mark.skipif(not shutil.which("uv") or not os.path.exists(SYSTEM_PYTHON), reason="needs uv and /usr/bin/python3")
def test_uv_install_and_compile_from_index(svc, tmp_path):
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_CACHE_DIR=str(tmp_path / "uvcache"), UV_NO_CONFIG="1")
    env.pop("VIRTUAL_ENV", None)
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "-p", SYSTEM_PYTHON, str(venv)], check=True, env=env)
    r = subprocess.run(["uv", "pip", "install", "--python", str(venv / "bin" / "python"), "--index-url", svc["urls"]["index"],
                        "kpgs-probe==1.2.3"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import kpgs_probe; print(kpgs_probe.VERSION)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1.2.3"
    (tmp_path / "req.in").write_text("kpgs-probe\n")
    r = subprocess.run(["uv", "pip", "compile", "-q", "--generate-hashes", "-p", SYSTEM_PYTHON, "--index-url", svc["urls"]["index"],
                        str(tmp_path / "req.in")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    whl = os.listdir(str(svc["wheels"]))[0]
    assert "kpgs-probe==1.2.3" in r.stdout
    assert "--hash=sha256:%s" % hashlib.sha256((svc["wheels"] / whl).read_bytes()).hexdigest() in r.stdout
    log = [json.loads(line) for line in (svc["state"] / "index-access.jsonl").read_text().splitlines()]
    assert any(e["path"] == "/simple/kpgs-probe/" and e["ua"].startswith("uv/") for e in log)


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs /usr/bin/python3")
def test_pip_install_from_index(svc, tmp_path):
    venv = tmp_path / "pvenv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True)
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("PIP_"))
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-cache-dir", "--index-url", svc["urls"]["index"], "kpgs-probe"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Successfully installed kpgs-probe-1.2.3" in r.stdout


def test_hub_snapshot_download_verifies(svc, tmp_path):
    hf = pytest.importorskip("huggingface_hub")
    hub = svc["urls"]["hub"]
    prog = ("import json, sys\nfrom huggingface_hub import snapshot_download\n"
            "print(snapshot_download(sys.argv[1], revision='main', cache_dir=sys.argv[2]))\n")
    env = dict(os.environ, HF_ENDPOINT=hub, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    env.pop("HF_TOKEN", None)
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "python"), "-c", prog, svc["urls"]["hub_repo"], str(tmp_path / "c")],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    snap = r.stdout.strip().splitlines()[-1]
    assert snap.endswith(svc["urls"]["hub_commit"])
    tree = json.loads(get("%s/api/models/%s/tree/main?recursive=true" % (hub, svc["urls"]["hub_repo"]))[2])
    assert len(tree) == 24 and hf.__version__
    for item in tree:
        data = open(os.path.join(snap, item["path"]), "rb").read()
        assert len(data) == item["size"]
        if "lfs" in item:
            assert hashlib.sha256(data).hexdigest() == item["lfs"]["oid"]
        else:
            assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == item["oid"]
    # safetensors shards: 8-byte header length, JSON header, data sized as the header says
    shard = os.path.join(snap, "model-00003-of-00015.safetensors")
    with open(shard, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    assert 8 + n + end == os.path.getsize(shard)
    index = json.load(open(os.path.join(snap, "model.safetensors.index.json")))
    assert index["metadata"]["total_size"] == 55600000000
    assert all(index["weight_map"][k] == "model-00003-of-00015.safetensors" for k in header if k != "__metadata__")


def test_hub_headers_faults_and_log(svc):
    hub, repo, commit = svc["urls"]["hub"], svc["urls"]["hub_repo"], svc["urls"]["hub_commit"]
    get(hub + "/_log?clear=true")
    url = "%s/%s/resolve/main/model-00001-of-00015.safetensors" % (hub, repo)
    req = urllib.request.Request(url, method="HEAD")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **kw):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as e:
        opener.open(req, timeout=10)
    h = e.value.headers
    assert e.value.code == 302 and h["X-Repo-Commit"] == commit and h["Location"].startswith(svc["urls"]["hub_cdn"] + "/_cdn/sha256/")
    sha = h["X-Linked-Etag"].strip('"')
    size = int(h["X-Linked-Size"])
    # a cut, then a 500, then the full body
    get(hub + "/_ctl?file=model-00001-of-00015.safetensors&faults=cut:1000,status:500")
    with pytest.raises(Exception):
        get(h["Location"])
    with pytest.raises(urllib.error.HTTPError) as e:
        get(h["Location"])
    assert e.value.code == 500
    _s, _h, body = get(h["Location"])
    assert len(body) == size and hashlib.sha256(body).hexdigest() == sha
    log = get(hub + "/_log?clear=true")[2]
    cdn = [e for e in json.loads(log) if e["path"].startswith("/_cdn/")]
    # The client saw the order (cut, 500, full body); the cut request may be logged after the next one, as its
    # handler logs once the dropped connection is closed.
    assert sorted((e["status"], e["bytes"]) for e in cdn) == sorted(
        [(200, 1000), (500, len(b'{"error": "injected fault"}')), (200, size)])
    assert all(e["svc"] == "cdn" and e["file"] == "model-00001-of-00015.safetensors" for e in cdn)
    # unknown revision / file: the hub's error codes
    with pytest.raises(urllib.error.HTTPError) as e:
        get("%s/api/models/%s/revision/nope" % (hub, repo))
    assert e.value.code == 404 and e.value.headers["X-Error-Code"] == "RevisionNotFound"
    with pytest.raises(urllib.error.HTTPError) as e:
        get("%s/%s/resolve/main/nope.bin" % (hub, repo))
    assert e.value.headers["X-Error-Code"] == "EntryNotFound"
    info = json.loads(get("%s/api/models/%s?blobs=true" % (hub, repo))[2])
    assert info["sha"] == commit and info["usedStorage"] == sum(s["size"] for s in info["siblings"])


def test_hub_token(tmp_path):
    token = "hf_labTokenForTests"
    running = _labsvc().start(["--addr", "127.0.0.1", "--state-dir", str(tmp_path / "st"), "--hub-port", "0",
                               "--hub-shards", "2", "--hub-shard-size", "64KiB", "--hub-token", token])
    with running:
        url = "%s/api/models/%s/revision/main" % (running.urls["hub"], running.urls["hub_repo"])
        with pytest.raises(urllib.error.HTTPError) as e:
            get(url)
        assert e.value.code == 401 and e.value.headers["X-Error-Code"] == "GatedRepo"
        with pytest.raises(urllib.error.HTTPError) as e:
            get(url, {"Authorization": "Bearer wrong"})
        assert e.value.code == 401 and e.value.headers["X-Error-Code"] == "RepoNotFound"
        assert json.loads(get(url, {"Authorization": "Bearer " + token})[2])["sha"] == running.urls["hub_commit"]
        log = (tmp_path / "st" / "hub-access.jsonl").read_text()
        assert token not in log
    assert running.proc.returncode == 0


def test_hub_whoami_as_huggingface_hub_reads_it(tmp_path):
    """huggingface_hub's own HfApi.whoami against the stand-in: the token's user, "Invalid user token." otherwise."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError
    token = "hf_labTokenForTests"
    running = _labsvc().start(["--addr", "127.0.0.1", "--state-dir", str(tmp_path / "st"), "--hub-port", "0",
                               "--hub-shards", "2", "--hub-shard-size", "64KiB", "--hub-token", token])
    with running:
        api = HfApi(endpoint=running.urls["hub"])
        me = api.whoami(token=token)
        assert me["type"] == "user" and me["name"] and me["auth"]["accessToken"]["role"] == "read"
        with pytest.raises(HfHubHTTPError) as e:
            api.whoami(token="hf_wrong")
        assert e.value.response.status_code == 401 and str(e.value).startswith("Invalid user token.")
        assert e.value.response.json() == {"error": "Invalid credentials in Authorization header"}
    assert running.proc.returncode == 0
