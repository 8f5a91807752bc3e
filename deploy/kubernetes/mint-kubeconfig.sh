#!/usr/bin/env bash
# Mint a kubeconfig for one node's rebootd, using the cluster admin's current kubectl context.
#
#   deploy/kubernetes/mint-kubeconfig.sh [--mode csr|token] [--days N] [--server URL]
#                                        [--ca-file FILE] [--output FILE] NODE_NAME
#
# --mode csr (default): a client certificate for the user "rebootd:node:NODE_NAME" in the group
#   "rebootd:nodes", signed by the cluster through the CertificateSigningRequest API (signer
#   kubernetes.io/kube-apiserver-client). The private key is made here and never leaves this
#   machine except inside the kubeconfig. Needs: kubectl allowed to create and approve CSRs, openssl.
# --mode token: a ServiceAccount "node-NODE_NAME" in the namespace "rebootd", bindings for it to the
#   rebootd roles, and a bound token (kubectl create token) valid for --days.
#
# Either way the roles come from deploy/kubernetes (kubectl apply -k deploy/kubernetes first), and
# the result is written with mode 0600, to be copied to the node as /etc/rebootd/kubeconfig
# (root:root 0600) and named in rebootd's configuration:
#   [kubernetes]
#   kubeconfig = "/etc/rebootd/kubeconfig"
# README.md beside this script compares the two modes.
set -euo pipefail

NAMESPACE=rebootd
GROUP=rebootd:nodes
CLUSTER_ROLE=rebootd-node
LEASE_ROLE=rebootd-lease

usage() {
    sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

mode=csr
days=365
server=
ca_file=
output=
node=
while [ $# -gt 0 ]; do
    case "$1" in
    --mode) mode=${2:?}; shift 2 ;;
    --days) days=${2:?}; shift 2 ;;
    --server) server=${2:?}; shift 2 ;;
    --ca-file) ca_file=${2:?}; shift 2 ;;
    --output | -o) output=${2:?}; shift 2 ;;
    -h | --help) usage ;;
    -*) echo "unknown option: $1" >&2; usage ;;
    *)
        [ -z "$node" ] || usage
        node=$1; shift ;;
    esac
done
[ -n "$node" ] || usage
case "$mode" in csr | token) ;; *) echo "--mode must be csr or token" >&2; exit 2 ;; esac
case "$days" in '' | *[!0-9]*) echo "--days must be a whole number" >&2; exit 2 ;; esac
[ "$days" -ge 1 ] || { echo "--days must be at least 1" >&2; exit 2; }
# A node name is a DNS subdomain; it becomes part of object and user names below.
if ! [[ "$node" =~ ^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$ ]]; then
    echo "not a Kubernetes node name: $node" >&2
    exit 2
fi
output=${output:-rebootd-$node.kubeconfig}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077

# The API server address and CA, from the current context unless given.
if [ -z "$server" ]; then
    server=$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')
fi
[ -n "$server" ] || { echo "no API server address in the current context; pass --server" >&2; exit 1; }
if [ -n "$ca_file" ]; then
    ca_data=$(base64 -w0 <"$ca_file")
else
    ca_data=$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
    if [ -z "$ca_data" ]; then
        ca_path=$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
        [ -n "$ca_path" ] || { echo "no cluster CA in the current context; pass --ca-file" >&2; exit 1; }
        ca_data=$(base64 -w0 <"$ca_path")
    fi
fi

user="rebootd:node:$node"
if [ "$mode" = csr ]; then
    csr_name="rebootd-node-$node"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/key.pem" 2>/dev/null
    openssl req -new -key "$work/key.pem" -subj "/O=$GROUP/CN=$user" -out "$work/req.pem"
    # A CSR object's spec cannot change: replace a leftover from an earlier run.
    kubectl delete csr "$csr_name" --ignore-not-found >/dev/null
    kubectl apply -f - >/dev/null <<EOF
apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata:
  name: $csr_name
  labels:
    app.kubernetes.io/name: rebootd
spec:
  request: $(base64 -w0 <"$work/req.pem")
  signerName: kubernetes.io/kube-apiserver-client
  expirationSeconds: $((days * 86400))
  usages:
    - digital signature
    - client auth
EOF
    kubectl certificate approve "$csr_name" >/dev/null
    # The signer answers within seconds once approved; give up after a minute.
    cert=
    for _ in $(seq 60); do
        cert=$(kubectl get csr "$csr_name" -o jsonpath='{.status.certificate}')
        [ -z "$cert" ] || break
        sleep 1
    done
    [ -n "$cert" ] || { echo "CSR $csr_name was approved but not signed within 60 s (does this cluster sign kubernetes.io/kube-apiserver-client?)" >&2; exit 1; }
    printf '%s' "$cert" | base64 -d >"$work/cert.pem"
    not_after=$(openssl x509 -in "$work/cert.pem" -noout -enddate | cut -d= -f2)
    credentials="      client-certificate-data: $(base64 -w0 <"$work/cert.pem")
      client-key-data: $(base64 -w0 <"$work/key.pem")"
    echo "certificate for $user (group $GROUP) valid until $not_after" >&2
else
    sa="node-$node"
    user="system:serviceaccount:$NAMESPACE:$sa"
    kubectl -n "$NAMESPACE" create serviceaccount "$sa" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    kubectl create clusterrolebinding "rebootd-node-$node" --clusterrole="$CLUSTER_ROLE" \
        --serviceaccount="$NAMESPACE:$sa" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    kubectl -n "$NAMESPACE" create rolebinding "rebootd-lease-$node" --role="$LEASE_ROLE" \
        --serviceaccount="$NAMESPACE:$sa" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    token=$(kubectl -n "$NAMESPACE" create token "$sa" --duration="$((days * 24))h")
    [ -n "$token" ] || { echo "no token for $user" >&2; exit 1; }
    credentials="      token: $token"
    echo "token for $user, valid for at most $days days (the API server may cap it)" >&2
fi

cat >"$work/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: cluster
    cluster:
      server: $server
      certificate-authority-data: $ca_data
users:
  - name: $user
    user:
$credentials
contexts:
  - name: rebootd
    context:
      cluster: cluster
      user: $user
current-context: rebootd
EOF
install -m 0600 "$work/kubeconfig" "$output"
echo "wrote $output: copy it to $node as /etc/rebootd/kubeconfig (root:root, 0600)" >&2
