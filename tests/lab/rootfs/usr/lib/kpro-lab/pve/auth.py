"""Authentication as pveproxy does it: root@pam password -> ticket + CSRF token, API tokens.

Files (written by tests/lab/build.d/20-pve-pki.sh; all under /etc/pve):
- ``priv/kpro-lab-pam.shadow``: ``<user>:<hash>:`` lines, the lab's stand-in for PAM's
  /etc/shadow (hash: ``$pbkdf2-sha256$<iterations>$<salt hex>$<digest hex>``);
- ``priv/token.cfg``: ``<user>@<realm>!<name> <secret>`` (PVE's own format, pve-access-control
  src/PVE/TokenConfig.pm);
- ``user.cfg``: the users and their ``token:`` lines (read by :mod:`pve.access`, which also checks
  what a token may do); a token is accepted only when its user is enabled and user.cfg has it,
  unexpired (pve-access-control 8.2.2 src/PVE/AccessControl.pm verify_token, :474-502);
- ``priv/kpro-lab-ticket.key``: the key that signs tickets and CSRF tokens (authkey stand-in).

Tickets: ``PVE:<user>:<hex time>::<signature>``, valid two hours; CSRF tokens
``<hex time>:<signature>``.
"""

import base64
import hashlib
import hmac
import os
import secrets
import sys
import time
import uuid

import pve
from pve import PVEError

TICKET_LIFETIME = 7200
SHADOW_REL = "priv/kpro-lab-pam.shadow"
TOKENS_REL = "priv/token.cfg"
USERCFG_REL = "user.cfg"
KEY_REL = "priv/kpro-lab-ticket.key"
ITERATIONS = 100000


class AuthError(Exception):
    """401 with this reason (pveproxy answers 401 '<message>' with no body, after a delay)."""


def hash_password(password, salt=None, iterations=ITERATIONS):
    salt = salt or secrets.token_hex(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), bytes.fromhex(salt), iterations).hex()
    return "$pbkdf2-sha256$%d$%s$%s" % (iterations, salt, digest)


def check_password_hash(password, stored):
    try:
        _e, scheme, iterations, salt, digest = stored.split("$")
    except ValueError:
        return False
    if scheme != "pbkdf2-sha256":
        return False
    calc = hashlib.pbkdf2_hmac("sha256", password.encode(), bytes.fromhex(salt), int(iterations)).hex()
    return hmac.compare_digest(calc, digest)


def _read(rel):
    try:
        with open(pve.pve_dir(rel)) as f:
            return f.read()
    except OSError:
        return ""


def _key():
    path = pve.pve_dir(KEY_REL)
    try:
        with open(path) as f:
            key = f.read().strip()
            if key:
                return key.encode()
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    key = secrets.token_hex(32)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(key + "\n")
    os.rename(tmp, path)
    return key.encode()


def _sign(text):
    return base64.b64encode(hmac.new(_key(), text.encode(), hashlib.sha256).digest()).decode().rstrip("=")


def normalize_user(username, realm=None):
    username = (username or "").strip()
    if realm and "@" not in username:
        username = "%s@%s" % (username, realm)
    return username


def verify_password(username, password):
    """PAM stand-in: True when ``password`` is right for ``username`` (user@pam)."""
    if "@" not in username:
        return False
    user, realm = username.split("@", 1)
    if realm != "pam":
        return False
    for line in _read(SHADOW_REL).splitlines():
        parts = line.split(":")
        if len(parts) >= 2 and parts[0] == user:
            return check_password_hash(password, parts[1])
    return False


def create_ticket(username):
    stamp = "%08X" % int(time.time())
    plain = "PVE:%s:%s" % (username, stamp)
    return "%s::%s" % (plain, _sign(plain))


def verify_ticket(ticket):
    """The user of a valid ticket, else AuthError."""
    try:
        plain, sig = ticket.rsplit("::", 1)
        prefix, user, stamp = plain.split(":")
        age = int(time.time()) - int(stamp, 16)
    except (ValueError, AttributeError):
        raise AuthError("invalid ticket")
    if prefix != "PVE" or not hmac.compare_digest(_sign(plain), sig):
        raise AuthError("invalid ticket")
    if age < -300 or age > TICKET_LIFETIME:
        raise AuthError("ticket expired")
    return user


def create_csrf_token(username):
    stamp = "%08X" % int(time.time())
    return "%s:%s" % (stamp, _sign("%s:%s" % (stamp, username)))


def verify_csrf_token(username, token):
    try:
        stamp, sig = (token or "").split(":", 1)
        age = int(time.time()) - int(stamp, 16)
    except ValueError:
        raise AuthError("Permission denied - invalid csrf token")
    if not hmac.compare_digest(_sign("%s:%s" % (stamp, username)), sig) or age < -300 or age > TICKET_LIFETIME:
        raise AuthError("Permission denied - invalid csrf token")


def _token_known(tokenid):
    """AccessControl.pm verify_token (:489-497): the user is enabled and not expired, user.cfg has the token,
    and it has not expired."""
    from pve import access
    tok = access.split_tokenid(tokenid)
    cfg = access.load()
    user = cfg.users.get(tok[0]) if tok else None
    info = cfg.token(tokenid)
    now = time.time()
    return bool(user and user.get("enable") and not (user.get("expire") and user["expire"] < now)
                and info is not None and not (info.get("expire") and info["expire"] < now))


def _token_values():
    values = {}
    for line in _read(TOKENS_REL).splitlines():
        parts = line.split()
        if len(parts) == 2:
            values[parts[0]] = parts[1]
    return values


def add_token(tokenid):
    """PVE::TokenConfig::generate_token (src/PVE/TokenConfig.pm:47-66): a new UUID for ``tokenid`` in
    priv/token.cfg; returns the secret."""
    values = _token_values()
    values[tokenid] = str(uuid.uuid4())
    _write_tokens(values)
    return values[tokenid]


def remove_token(tokenid):
    """PVE::TokenConfig::delete_token (src/PVE/TokenConfig.pm:68-80)."""
    values = _token_values()
    values.pop(tokenid, None)
    _write_tokens(values)


def _write_tokens(values):
    """priv/token.cfg as its writer makes it (src/PVE/TokenConfig.pm:34-43): one line a token, sorted."""
    path = pve.pve_dir(TOKENS_REL)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join("%s %s\n" % (k, values[k]) for k in sorted(values)))
    os.rename(tmp, path)


def verify_api_token(value):
    """``<user>@<realm>!<name>=<secret>`` (the part after ``PVEAPIToken=``) -> token id, else AuthError."""
    value = (value or "").strip()
    if "=" not in value:
        raise AuthError("Authentication failed!")
    tokenid, secret = value.split("=", 1)
    if "!" not in tokenid or "@" not in tokenid.split("!", 1)[0]:
        raise AuthError("Authentication failed!")
    for line in _read(TOKENS_REL).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == tokenid and hmac.compare_digest(parts[1], secret) and _token_known(tokenid):
            return tokenid
    raise AuthError("Authentication failed!")


def ticket_response(username, password):
    """POST /access/ticket: a new ticket for a right password, or for a still valid ticket (renewal)."""
    ok = verify_password(username, password)
    if not ok and password and password.startswith("PVE:"):
        try:
            ok = verify_ticket(password) == username
        except AuthError:
            ok = False
    if not ok:
        raise PVEError("authentication failure", 401)
    return {"username": username, "ticket": create_ticket(username), "CSRFPreventionToken": create_csrf_token(username),
            "cap": {"vms": {"VM.PowerMgmt": 1, "VM.Config.Options": 1, "VM.Audit": 1, "VM.Allocate": 1},
                    "nodes": {"Sys.Audit": 1, "Sys.Modify": 1}, "access": {}, "storage": {}, "dc": {}, "sdn": {},
                    "mapping": {"Mapping.Audit": 1}}}


def main(argv):
    """``python3 -m pve.auth hash <password>`` (used by build.d/20-pve-pki.sh)."""
    if len(argv) == 2 and argv[0] == "hash":
        print(hash_password(argv[1]))
        return 0
    sys.stderr.write("usage: python3 -m pve.auth hash <password>\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
