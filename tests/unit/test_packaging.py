"""Packaging: the collection tarball, its installed copy, a plain clone, the execution
environment, the changelog and the sanity ignores. Offline: builds and installs from files only."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.dirname(sys.executable)  # the venv's bin: ansible-galaxy, ansible-builder, ...
GALAXY = yaml.safe_load(open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8"))
VERSION = GALAXY["version"]
PLAYBOOK = "migrate-kpro6-to-kpro5.yml"
FQCN_PLAYBOOK = "kpro.gpu_serving.migrate_kpro6_to_kpro5"

# What users never get: the lab and the tests, the real and the lab inventories, development state.
FORBIDDEN = ("tests", "extensions", "collections", "requirements", ".ansible", ".venv",
             ".collections", ".build", ".cache", ".ci", ".git", ".gitignore", ".ansible-lint", "Makefile",
             "ansible.cfg", "pytest.ini", PLAYBOOK)
REQUIRED = ("LICENSE", "README.md", "CHANGELOG.rst", "changelogs/changelog.yaml", "meta/runtime.yml",
            "meta/execution-environment.yml", "meta/requirements.txt", "meta/bindep.txt", "requirements.txt",
            "bindep.txt", "plugins/modules/sglang_compat.py", "plugins/connection/pct.py",
            "roles/sglang_server/tasks/main.yml", "playbooks/migrate-kpro6-to-kpro5.yml",
            "playbooks/migrate_kpro6_to_kpro5.yml", "docs/troubleshooting.md", "playbooks/deploy.yml",
            "inventories/fleet-example/hosts.yml", "inventories/fleet-example/group_vars/all/vault.yml.example")
# The one inventory shipped: the example a Galaxy user copies (RFC 5737 addresses).
FLEET_EXAMPLE = "inventories/fleet-example"


def tool(name):
    return os.path.join(BIN, name)


def isolated_env(tmp, **extra):
    """No project config, no user collections: only what the test points at."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    home = os.path.join(tmp, "home")
    os.makedirs(home, exist_ok=True)
    empty_cfg = os.path.join(tmp, "empty.cfg")
    open(empty_cfg, "w", encoding="utf-8").close()
    env.update(HOME=home, ANSIBLE_CONFIG=empty_cfg, ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False",
               ANSIBLE_LOCAL_TEMP=os.path.join(tmp, "ansible-tmp"), ANSIBLE_NOCOLOR="1")
    env.update(extra)
    return env


def run(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, **kw)
    assert res.returncode == 0, "%s failed (%d):\n%s\n%s" % (cmd, res.returncode, res.stdout, res.stderr)
    return res


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("build"))
    run([tool("ansible-galaxy"), "collection", "build", "--output-path", out, REPO],
        env=isolated_env(out), cwd=out)
    tarball = os.path.join(out, "kpro-gpu_serving-%s.tar.gz" % VERSION)
    with tarfile.open(tarball) as tar:
        names = [m.name for m in tar.getmembers()]
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    return tarball, names, manifest


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("installed"))
    colls = os.path.join(tmp, "colls")
    env = isolated_env(tmp, ANSIBLE_COLLECTIONS_PATH=colls)
    run([tool("ansible-galaxy"), "collection", "install", "--offline", "-p", colls, built[0]], env=env, cwd=tmp)
    return tmp, colls, env


def test_tarball_holds_only_what_users_run(built):
    names = built[1]
    tops = {n.split("/", 1)[0] for n in names}
    leaked = [n for n in names if n.split("/", 1)[0] in FORBIDDEN or "__pycache__" in n or n.endswith(".pyc")
              or (n.startswith("inventories/") and not (n + "/").startswith(FLEET_EXAMPLE + "/"))]
    assert not leaked, "development files in the tarball: %s" % leaked[:20]
    assert tops <= {"MANIFEST.json", "FILES.json", "LICENSE", "README.md", "CHANGELOG.rst", "CHANGELOG.md",
                    "requirements.txt", "bindep.txt", "changelogs", "docs", "inventories", "meta", "playbooks",
                    "plugins", "roles"}, sorted(tops)
    missing = [r for r in REQUIRED if r not in names]
    assert not missing, missing


def test_manifest_metadata(built):
    info = built[2]["collection_info"]
    assert info["license"] == ["GPL-3.0-or-later"]
    for key in ("repository", "documentation", "issues", "homepage"):
        assert info[key].startswith("https://") and "example.invalid" not in info[key], (key, info[key])
    with open(os.path.join(REPO, "LICENSE"), encoding="utf-8") as f:
        assert "GNU GENERAL PUBLIC LICENSE" in f.read(200)


def test_installed_collection_runs_a_module(installed):
    tmp, colls, env = installed
    res = run([tool("ansible"), "localhost", "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
               "-m", "kpro.gpu_serving.sglang_compat", "-a", "version=0.5.11 architecture=Qwen3_5ForConditionalGeneration tp=2"],
              env=env, cwd=tmp)
    assert "SUCCESS" in res.stdout, res.stdout
    doc = json.loads(run([tool("ansible-doc"), "-j", "kpro.gpu_serving.deb_packages"], env=env, cwd=tmp).stdout)
    # resolved from the installed copy, not from the checkout
    assert doc["kpro.gpu_serving.deb_packages"]["doc"]["filename"].startswith(colls)
    run([tool("ansible-doc"), "-t", "connection", "kpro.gpu_serving.pct"], env=env, cwd=tmp)


def test_installed_collection_runs_the_playbook_by_fqcn(installed):
    tmp, colls, env = installed
    res = run([tool("ansible-playbook"), "-i", "localhost,", "--syntax-check", FQCN_PLAYBOOK], env=env, cwd=tmp)
    assert colls in res.stdout, res.stdout


def test_every_shipped_playbook_passes_syntax_check_by_fqcn(built, installed):
    """As a Galaxy user: from a directory outside the repository, the collection only in an empty collections path,
    the shipped fleet example as inventory; every shipped playbook by FQCN (a hyphenated name cannot be one, so its
    underscore twin imports it). --syntax-check contacts no host."""
    tmp, colls, env = installed
    shipped = sorted(n[len("playbooks/"):-len(".yml")] for n in built[1]
                     if n.startswith("playbooks/") and n.endswith(".yml") and n.count("/") == 1)
    assert "deploy" in shipped, shipped
    fqcn = [name for name in shipped if name.isidentifier()]
    assert not [name for name in shipped if name.replace("-", "_") not in fqcn], shipped
    inventory = os.path.join(colls, "ansible_collections", "kpro", "gpu_serving", *FLEET_EXAMPLE.split("/"))
    assert os.path.isfile(os.path.join(inventory, "hosts.yml"))
    elsewhere = os.path.join(tmp, "elsewhere")
    os.makedirs(elsewhere, exist_ok=True)
    for name in fqcn:
        res = run([tool("ansible-playbook"), "-i", inventory, "--syntax-check", "kpro.gpu_serving." + name],
                  env=env, cwd=elsewhere)
        assert "playbook: " + os.path.join(colls, "ansible_collections", "kpro", "gpu_serving", "playbooks") in res.stdout, \
            (name, res.stdout)
        # the inventory parsed, its groups there (kpro_rollout alone is made by the run, so unknown to a syntax check)
        unmatched = re.findall(r"Could not match supplied host pattern, ignoring: (\S+)", res.stderr)
        assert set(unmatched) <= {"kpro_rollout"} and "nable to parse" not in res.stderr, (name, res.stderr)
        assert "No inventory was parsed" not in res.stderr, (name, res.stderr)


def test_installed_collection_declares_its_ee_dependencies(installed):
    """ansible-builder's introspection, as when the collection is installed into another EE."""
    tmp, colls, env = installed
    import ansible_builder  # pylint: disable=import-outside-toplevel
    script = os.path.join(os.path.dirname(ansible_builder.__file__), "_target_scripts", "introspect.py")
    pip, bindep = os.path.join(tmp, "pip.txt"), os.path.join(tmp, "bindep.txt")
    run([sys.executable, script, "introspect", "--write-pip", pip, "--write-bindep", bindep, colls], env=env, cwd=tmp)
    # the pct connection needs the ssh client and no Python library (paramiko no more)
    if os.path.exists(pip):
        with open(pip, encoding="utf-8") as f:
            assert "paramiko" not in f.read()
    with open(bindep, encoding="utf-8") as f:
        assert "openssh-client" in f.read()


def test_execution_environment_context(tmp_path):
    ctx = str(tmp_path / "ee")
    run([tool("ansible-builder"), "create", "-f", os.path.join(REPO, "meta", "execution-environment.yml"),
         "-c", ctx, "--output-filename", "Containerfile"], env=isolated_env(str(tmp_path)), cwd=str(tmp_path))
    with open(os.path.join(ctx, "Containerfile"), encoding="utf-8") as f:
        containerfile = f.read()
    with open(os.path.join(REPO, "meta", "execution-environment.yml"), encoding="utf-8") as f:
        ee = yaml.safe_load(f)
    assert ee["version"] == 3
    assert ee["images"]["base_image"]["name"] in containerfile
    assert "ansible-core" in containerfile and "ansible-runner" in containerfile
    with open(os.path.join(ctx, "_build", "requirements.txt"), encoding="utf-8") as f:
        assert "paramiko" not in f.read()
    with open(os.path.join(ctx, "_build", "bindep.txt"), encoding="utf-8") as f:
        assert "openssh-client" in f.read()


def _read(*path):
    with open(os.path.join(REPO, *path), encoding="utf-8") as f:
        return f.read()


def test_declared_ansible_core_minors_agree():
    """meta/runtime.yml's floor is every role's and the EE's, and make core-matrix has a lock for each declared minor
    below the dev lock's (which the rest of make test runs on)."""
    floor = re.fullmatch(r">=(2\.\d+)\.0", yaml.safe_load(_read("meta", "runtime.yml"))["requires_ansible"]).group(1)
    for role in sorted(os.listdir(os.path.join(REPO, "roles"))):
        meta = yaml.safe_load(_read("roles", role, "meta", "main.yml"))
        assert meta["galaxy_info"]["min_ansible_version"] == floor, role
    pin = yaml.safe_load(_read("meta", "execution-environment.yml"))["dependencies"]["ansible_core"]["package_pip"]
    assert pin.startswith("ansible-core>=%s," % floor), pin
    dev = re.search(r"^ansible-core==(2\.\d+)\.", _read("requirements", "dev.lock"), re.M).group(1)
    below = ["2.%d" % n for n in range(int(floor.split(".")[1]), int(dev.split(".")[1]))]
    assert re.search(r"^CORE_MINORS := (.*)$", _read("Makefile"), re.M).group(1).split() == below
    for minor in below:
        assert re.search(r"^ansible-core==%s\.\d+ " % re.escape(minor), _read("requirements", "core-%s.lock" % minor), re.M)


def _clone(tmp):
    if not os.path.exists(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout")
    clone = os.path.join(tmp, "clone")
    run(["git", "clone", "--quiet", REPO, clone])
    return clone


def test_plain_clone_resolves_the_collection(tmp_path):
    """A fresh clone (committed HEAD, no make setup): its ansible.cfg and collections/ are enough."""
    tmp = str(tmp_path)
    clone = _clone(tmp)
    assert not os.path.exists(os.path.join(clone, ".collections"))
    env = isolated_env(tmp)
    del env["ANSIBLE_CONFIG"]  # the clone's own ansible.cfg, as for a user in the checkout
    for target in (PLAYBOOK, FQCN_PLAYBOOK, "playbooks/" + PLAYBOOK):
        res = run([tool("ansible-playbook"), "--syntax-check", target], env=env, cwd=clone)
        assert "ERROR" not in res.stderr, res.stderr
    # As under AWX: collections path from the environment, the playbook's collections/ still resolves.
    env.update(ANSIBLE_COLLECTIONS_PATH=os.path.join(tmp, "none"), ANSIBLE_ROLES_PATH=os.path.join(tmp, "none"))
    run([tool("ansible-playbook"), "-i", "localhost,", "--syntax-check", PLAYBOOK], env=env, cwd=clone)


def test_collection_link_points_at_the_checkout():
    link = os.path.join(REPO, "collections", "ansible_collections", "kpro", "gpu_serving")
    assert os.path.islink(link) and os.readlink(link) == "../../.."
    assert os.path.samefile(link, REPO)


def _version(text):
    return tuple(int(part) for part in text.split("."))


def test_pending_fragments_belong_to_an_unreleased_version():
    """galaxy.yml names the next release while fragments wait for it, never one already released."""
    with open(os.path.join(REPO, "changelogs", "changelog.yaml"), encoding="utf-8") as f:
        released = list(yaml.safe_load(f)["releases"])
    pending = sorted(n for n in os.listdir(os.path.join(REPO, "changelogs", "fragments")) if n.endswith((".yml", ".yaml")))
    assert not (VERSION in released and pending), \
        "galaxy.yml's %s is released already, yet fragments wait: %s; bump galaxy.yml's version" % (VERSION, pending)
    assert _version(VERSION) >= max(map(_version, released)), (VERSION, released)


def test_changelog_lint_clean(tmp_path):
    for args in (["lint"], ["lint-changelog-yaml", "changelogs/changelog.yaml"]):
        res = run([tool("antsibull-changelog")] + args, cwd=REPO)
        assert not res.stdout.strip(), res.stdout
    # a fragment added after the release lints too
    copy = str(tmp_path / "c")
    shutil.copytree(os.path.join(REPO, "changelogs"), os.path.join(copy, "changelogs"))
    shutil.copy(os.path.join(REPO, "galaxy.yml"), copy)
    with open(os.path.join(copy, "changelogs", "fragments", "later.yml"), "w", encoding="utf-8") as f:
        f.write("---\nminor_changes:\n  - later - a change after the release.\n")
    res = run([tool("antsibull-changelog"), "lint"], cwd=copy)
    assert not res.stdout.strip(), res.stdout


def test_sanity_ignores_give_a_reason():
    folder = os.path.join(REPO, "tests", "sanity")
    for name in sorted(os.listdir(folder)):
        if name.startswith("ignore-"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                bare = [line for line in f.read().splitlines() if line.strip() and " # " not in line]
            assert not bare, "%s: entries without a reason: %s" % (name, bare)
