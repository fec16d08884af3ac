"""The container's systemd stand-in (tests/lab/rootfs-ct/usr/lib/kpro-lab/ctinit.py) reads command lines and prints
`systemctl show` as systemd 252 does (systemd.service(5) "Command lines"; src/core/load-fragment.c config_parse_exec(),
src/basic/extract-word.c, src/basic/env-util.c replace_env_argv(), src/shared/specifier.c), so that a value is
neither accepted nor refused in the lab only. Pure functions and a unit loaded from a temporary directory: no lab."""

import importlib.util
import os
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _load(rel, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, rel))
    mod = importlib.util.module_from_spec(spec)
    old, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = old
    return mod


ct = _load("tests/lab/rootfs-ct/usr/lib/kpro-lab/ctinit.py", "kpgs_ctinit_exec")
TABLE = ct.specifier_table("sglang@a-b.service", "/etc/systemd/system/sglang@.service")
ENV = {"A": "one two", "Q": 'x "y z"', "EMPTY": "", "INVOCATION_ID": "0" * 32}


def argv(line, env=None):
    """The argv systemd executes for one ExecStart= value (one command)."""
    (cmd,) = ct.config_parse_exec(line, TABLE)
    return cmd["argv"] if cmd["no_expand"] else ct.replace_env_argv(cmd["argv"], ENV if env is None else env)


@pytest.mark.parametrize("line, want", [
    ("/bin/x $$ a$$b $${A} $$A", ["/bin/x", "$", "a$b", "${A}", "$A"]),        # "$$" is a literal "$"
    ("/bin/x ${A} pre${A}post", ["/bin/x", "one two", "preone twopost"]),     # ${VAR}: one word, as is
    ("/bin/x $A", ["/bin/x", "one", "two"]),                                  # $VAR as a word: split
    ("/bin/x $Q", ["/bin/x", "x", "y z"]),                                    # ... quotes in the value group
    ("/bin/x a$A ${A:-d} ${A", ["/bin/x", "a$A", "${A:-d}", "${A"]),          # no braceless/extended forms
    ("/bin/x $ a", ["/bin/x", "a"]),                                          # a lone "$": an empty name, no word
    ("/bin/x $UNSET ${UNSET} $EMPTY", ["/bin/x", ""]),                        # unset $VAR: no word at all
    (":/bin/x $$ ${A}", ["/bin/x", "$$", "${A}"]),                            # ":" prefix: no expansion
])
def test_dollar_expansion_and_unescaping(line, want):
    assert argv(line) == want


@pytest.mark.parametrize("line, want", [
    ('/bin/x "a b" \'c d\' e"f g"h', ["/bin/x", "a b", "c d", "ef gh"]),
    (r"/bin/x 'a\nb' \s \x41\101 \u00e9 \"q\"", ["/bin/x", "a\nb", " ", "AA", "\u00e9", '"q"']),  # C escapes, even in ''
    ("/bin/x a\\qb a\\; z\\", ["/bin/x", r"a\qb", r"a\;", "z\\"]),  # unknown escapes: kept verbatim (and a warning)
    (r"/bin/x \; ';' a;", ["/bin/x", ";", ";", "a;"]),      # "\;" and a quoted ";" are words
    ("/bin/x %n %N %p %i %I %j %% 100%",
     ["/bin/x", "sglang@a-b.service", "sglang@a-b", "sglang", "a-b", "a/b", "", "%", "100%"]),
    ("/bin/x %t/%p.sock %-", ["/bin/x", "/run/sglang.sock", "%-"]),
])
def test_quoting_escapes_and_specifiers(line, want):
    assert argv(line) == want


def test_semicolon_separates_commands_and_prefixes_apply_per_command():
    cmds = ct.config_parse_exec("-/bin/a x ; @/bin/b argv0 y ; :/bin/c $$", TABLE)
    assert [(c["path"], c["argv"], c["ignore"], c["no_expand"]) for c in cmds] == [
        ("/bin/a", ["/bin/a", "x"], True, False), ("/bin/b", ["argv0", "y"], False, False),
        ("/bin/c", ["/bin/c", "$$"], False, True)]


@pytest.mark.parametrize("line", ['/bin/x "a b', "/bin/x %Z", "@/bin/x"])
def test_refused_like_systemd(line):
    with pytest.raises(ct.BadSetting):
        ct.config_parse_exec(line, TABLE)


def test_ignored_like_systemd():
    assert ct.config_parse_exec('"/bin/x', TABLE) == []                         # first word: the line is ignored
    assert [c["argv"] for c in ct.config_parse_exec("/bin/a ; -/bin/x %Z", TABLE)] == [["/bin/a"]]  # "-": dropped
    for bad in ("/bin/", "bin/x", "/bin/x\"y"):
        with pytest.raises(ct.BadSetting):
            ct.config_parse_exec("'%s'" % bad if '"' in bad else bad, TABLE)


def test_environment_lines():
    assert ct.parse_environment(r'A=1 "B=two words" C=$$x%% D=\x41 1X=no', TABLE) == {
        "A": "1", "B": "two words", "C": "$$x%", "D": "A"}                     # no $ handling in Environment=


def test_the_collections_unit_lines_come_back_as_written():
    """sglang_unit.exec_start()'s line and environment_assignment() read back by systemd's rules give the words and
    the value the collection meant, for values with $, %, quotes, backslashes, spaces and a lone ';'."""
    sys.path.insert(0, os.path.join(REPO, ".collections"))
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
    odd = ["$HOME", "a$$b", "${X}", "50%", "%n", "it's", 'say "hi"', "back\\slash", "two words", ";", "\\;", "",
           "tab\there"[:3]]
    words, line = su.exec_start("/opt/v", {"model_path": "/m", "extra": odd}, "sglang")
    assert argv(line, dict(ENV, HOME="/root", X="x")) == words
    for value in odd:
        assert ct.parse_environment(su.environment_assignment("V", value), TABLE) == {"V": value}


def _unit(tmp_path, monkeypatch, text, name="t.service"):
    monkeypatch.setattr(ct, "UNIT_DIRS", [str(tmp_path)])
    monkeypatch.setattr(ct, "RUN", str(tmp_path / "run"))
    (tmp_path / name).write_text(text)
    return ct.Unit(name)


def test_unit_file_continuations_and_bad_settings(tmp_path, monkeypatch):
    u = _unit(tmp_path, monkeypatch, "[Service]\nExecStart=/bin/x a \\\n# a comment inside\n  b c\\\\\n")
    assert u.load_state == "loaded" and u.cmds("ExecStart")[0]["argv"] == ["/bin/x", "a", "b", "c\\"]
    u = _unit(tmp_path, monkeypatch, "[Service]\nExecStart=/bin/x ; /bin/y\n")
    assert u.load_state == "bad-setting" and "more than one ExecStart=" in u.load_error
    u = _unit(tmp_path, monkeypatch, "[Service]\nExecStart=/bin/x %Z\n")
    assert u.load_state == "bad-setting" and "Failed to resolve unit specifiers" in u.load_error
    u = _unit(tmp_path, monkeypatch, "[Service]\nType=oneshot\nExecStart=/bin/x ; /bin/y \\; z\n")
    assert u.load_state == "loaded" and [c["argv"] for c in u.cmds("ExecStart")] == [["/bin/x"], ["/bin/y", ";", "z"]]


def test_show_prints_every_property_without_p(tmp_path, monkeypatch):
    _unit(tmp_path, monkeypatch, "[Unit]\nDescription=T\n[Service]\nExecStart=/bin/x $$A\n")
    pr = ct.properties("t.service")
    text = ct.show_text(pr, [], [])
    keys = [ln.split("=", 1)[0] for ln in text.splitlines()]
    assert keys[0] == "Type" and keys.index("MainPID") < keys.index("Id") < keys.index("ActiveState")
    assert "ControlGroup" not in keys and "LoadState=loaded" in text and "Description=T" in text   # empty: hidden
    assert "ExecStart={ path=/bin/x ; argv[]=/bin/x $$A ; ignore_errors=no ;" in text
    assert len(keys) >= 25 and len(keys) == len(set(keys))
    assert "ControlGroup=\n" in ct.show_text(pr, [], ["--all"])
    # -p: only those, empty ones too, in systemd's order (not the order asked)
    assert ct.show_text(pr, ["ControlGroup", "MainPID", "ActiveState"], []) == (
        "MainPID=0\nControlGroup=\nActiveState=inactive\n")
    assert ct.show_text(pr, ["ActiveState"], ["--value"]) == "inactive\n"


def test_show_without_a_unit_prints_the_managers_properties():
    text = ct.show_text(ct.manager_properties(), [], [])
    assert "Version=252.36-1~deb12u1\n" in text and "Virtualization=lxc\n" in text and "SystemState=running\n" in text
    assert "Tainted=" not in text
