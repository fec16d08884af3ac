#!/bin/sh
# The lab's PVE PKI and API credentials (run by labctl on the controller, before sshd).
#   $KPGS_RUN/pki/ca.{pem,key}           lab CA (the controller trusts ca.pem; the key never enters the node)
#   $KPGS_RUN/pki/pve-ssl.{pem,key}      server certificate for kpro5 / 10.213.5.2 (SAN as PVE's pve-ssl.pem:
#                                        127.0.0.1, ::1, localhost, the node address, name and FQDN)
#   $KPGS_RUN/pve-credentials.json       what the lab inventory and tests use (mode 0600):
#     {"host", "port", "node", "api_url", "ca_path", "user", "password",
#      "token_id", "token_user", "token_name", "token_secret"}
# and in the node ($KPGS_NODE_ROOT): /etc/pve/local/pve-ssl.{pem,key}, /etc/pve/pve-root-ca.pem,
# /etc/pve/priv/token.cfg, /etc/pve/priv/kpro-lab-pam.shadow, /etc/pve/priv/kpro-lab-ticket.key,
# /etc/pve/user.cfg, and the nodes/<node>/{lxc,qemu-server} layout with the local/lxc/qemu-server links.
# Idempotent: an existing CA, certificate and credentials are kept (secrets stay stable across rebuilds).
set -eu
LAB=$(cd "$(dirname "$0")/.." && pwd)
: "${KPGS_RUN:=$LAB/.run}"
NODE=${KPGS_NODE_NAME:-kpro5}
ADDR=${KPGS_NODE_ADDR:-10.213.5.2}
PORT=${KPGS_PVE_PORT:-8006}
PKI="$KPGS_RUN/pki"
CRED="$KPGS_RUN/pve-credentials.json"
LIB="$LAB/rootfs/usr/lib/kpro-lab"
umask 077
mkdir -p "$PKI"

CNF="$PKI/openssl.cnf"
cat > "$CNF" <<CNFEOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = $NODE.lab
O = kpro lab
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[v3_srv]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,IP:0:0:0:0:0:0:0:1,DNS:localhost,IP:$ADDR,DNS:$NODE,DNS:$NODE.lab
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
CNFEOF

if [ ! -s "$PKI/ca.pem" ] || [ ! -s "$PKI/ca.key" ]; then
    openssl req -x509 -new -newkey rsa:2048 -nodes -sha256 -days 3650 -config "$CNF" -extensions v3_ca \
        -subj "/CN=kpro lab PVE CA ($NODE)/O=kpro lab" -keyout "$PKI/ca.key.tmp" -out "$PKI/ca.pem.tmp" 2>/dev/null
    mv -f "$PKI/ca.key.tmp" "$PKI/ca.key"
    mv -f "$PKI/ca.pem.tmp" "$PKI/ca.pem"
    rm -f "$PKI/pve-ssl.pem"
fi
if [ ! -s "$PKI/pve-ssl.pem" ] || [ ! -s "$PKI/pve-ssl.key" ] || \
        ! openssl verify -CAfile "$PKI/ca.pem" "$PKI/pve-ssl.pem" >/dev/null 2>&1 || \
        ! openssl x509 -in "$PKI/pve-ssl.pem" -noout -ext subjectAltName 2>/dev/null | grep -q "IP Address:$ADDR\$\|IP Address:$ADDR,"; then
    openssl req -new -newkey rsa:2048 -nodes -sha256 -config "$CNF" -subj "/CN=$NODE.lab/OU=PVE Cluster Node/O=Proxmox Virtual Environment" \
        -keyout "$PKI/pve-ssl.key.tmp" -out "$PKI/pve-ssl.csr" 2>/dev/null
    openssl x509 -req -sha256 -days 825 -in "$PKI/pve-ssl.csr" -CA "$PKI/ca.pem" -CAkey "$PKI/ca.key" \
        -CAcreateserial -extfile "$CNF" -extensions v3_srv -out "$PKI/pve-ssl.pem.tmp" 2>/dev/null
    mv -f "$PKI/pve-ssl.key.tmp" "$PKI/pve-ssl.key"
    mv -f "$PKI/pve-ssl.pem.tmp" "$PKI/pve-ssl.pem"
    rm -f "$PKI/pve-ssl.csr"
fi
chmod 0644 "$PKI/ca.pem" "$PKI/pve-ssl.pem"

# credentials: keep the existing ones, else make new ones
PY=${KPGS_PYTHON:-python3}
"$PY" - "$CRED" "$NODE" "$ADDR" "$PORT" "$PKI/ca.pem" <<'PYEOF'
import json, os, secrets, sys, uuid
path, node, addr, port, ca = sys.argv[1:6]
try:
    with open(path) as f:
        old = json.load(f)
except (OSError, ValueError):
    old = {}
cred = {
    "host": addr, "port": int(port), "node": node, "api_url": "https://%s:%s/api2/json" % (addr, port), "ca_path": ca,
    "user": "root@pam", "password": old.get("password") or secrets.token_urlsafe(18),
    "token_id": "root@pam!ansible", "token_user": "root@pam", "token_name": "ansible",
    "token_secret": old.get("token_secret") or str(uuid.uuid4()),
}
if cred != old:
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(cred, f, indent=1, sort_keys=True)
        f.write("\n")
    os.rename(tmp, path)
PYEOF

[ -n "${KPGS_NODE_ROOT:-}" ] || exit 0
P="$KPGS_NODE_ROOT/etc/pve"
umask 022
install -d "$P/nodes/$NODE/lxc" "$P/nodes/$NODE/qemu-server" "$P/mapping"
install -d -m 0700 "$P/priv"
[ -e "$P/local" ] || [ -L "$P/local" ] || ln -s "nodes/$NODE" "$P/local"
[ -e "$P/lxc" ] || [ -L "$P/lxc" ] || ln -s "nodes/$NODE/lxc" "$P/lxc"
[ -e "$P/qemu-server" ] || [ -L "$P/qemu-server" ] || ln -s "nodes/$NODE/qemu-server" "$P/qemu-server"
install -m 0640 "$PKI/pve-ssl.pem" "$P/nodes/$NODE/pve-ssl.pem"
install -m 0600 "$PKI/pve-ssl.key" "$P/nodes/$NODE/pve-ssl.key"
install -m 0640 "$PKI/ca.pem" "$P/pve-root-ca.pem"
"$PY" - "$CRED" "$P" "$LIB" <<'PYEOF'
import json, os, secrets, sys
cred_path, pve, lib = sys.argv[1:4]
sys.path.insert(0, lib)
sys.dont_write_bytecode = True
from pve import auth  # noqa: E402
with open(cred_path) as f:
    cred = json.load(f)


def put(rel, text, mode):
    path = os.path.join(pve, rel)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.rename(tmp, path)


shadow = os.path.join(pve, auth.SHADOW_REL)
try:
    with open(shadow) as f:
        line = f.read().split("\n")[0].split(":")
    current = line[0] == "root" and auth.check_password_hash(cred["password"], line[1])
except (OSError, IndexError):
    current = False
if not current:
    put(auth.SHADOW_REL, "root:%s:\n" % auth.hash_password(cred["password"]), 0o600)
# token.cfg as PVE writes it (one "<tokenid> <secret>" line each, sorted): the lab's token set, the others kept
tokens = {}
try:
    with open(os.path.join(pve, auth.TOKENS_REL)) as f:
        tokens = dict(line.split() for line in f if len(line.split()) == 2)
except OSError:
    pass
tokens[cred["token_id"]] = cred["token_secret"]
put(auth.TOKENS_REL, "".join("%s %s\n" % (k, tokens[k]) for k in sorted(tokens)), 0o600)
if not os.path.exists(os.path.join(pve, auth.KEY_REL)):
    put(auth.KEY_REL, secrets.token_hex(32) + "\n", 0o600)
ucfg = os.path.join(pve, auth.USERCFG_REL)
try:
    with open(ucfg) as f:
        text = f.read()
except OSError:
    text = "user:root@pam:1:0:::root@%s.lab:::\n\n" % cred["node"]
# The lab's token has no privilege separation (privsep 0): it has root@pam's rights, which the API stand-in's tests
# use (config changes on a scratch CT, every path) and the lab's runs with other CT IDs too. The README's
# least-privilege token (a role, a privilege-separated token, ACLs) is made by its own pveum commands in
# tests/lab_tests/test_pve_token_privileges.py, which runs the preflight and the run with it.
if "token:%s:" % cred["token_id"] not in text:
    text = text.rstrip("\n") + "\ntoken:%s:0:0:kpro lab ansible:\n\n" % cred["token_id"]
    put(auth.USERCFG_REL, text.lstrip("\n"), 0o640)
PYEOF
