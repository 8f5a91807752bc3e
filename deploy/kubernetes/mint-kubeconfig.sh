#!/usr/bin/env bash
# Mint a kubeconfig for one node's rebootd, using the cluster admin's current kubectl context.
#
#   deploy/kubernetes/mint-kubeconfig.sh [--mode csr|token] [--days N] [--server URL]
#                                        [--ca-file FILE] [--output FILE] [--allow-pod-delete]
#                                        NODE_NAME
#   deploy/kubernetes/mint-kubeconfig.sh --revoke [--mode csr|token] NODE_NAME
#
# Each node gets an identity of its own, bound to the rebootd roles alone (no shared group), so
# deleting its bindings (--revoke) cuts off that node and no other, at once, whatever credential
# it still holds; the admission policy (admission-policy.yaml) reads the node name from the user
# name and keeps the node to its own Node and Leases.
# --mode csr (default): a client certificate for the user "rebootd:node:NODE_NAME" (no groups),
#   signed by the cluster through the CertificateSigningRequest API (signer
#   kubernetes.io/kube-apiserver-client), valid for --days (default 30, at most 365). The private
#   key is made here and never leaves this machine except inside the kubeconfig. Before approving,
#   the script reads the CSR back and checks that it is exactly the one it made (request, subject
#   without groups, key, usages, signer, lifetime), then approves that version of it only.
#   Needs: kubectl allowed to create and approve CSRs for that signer, openssl.
# --mode token: a ServiceAccount "node-NODE_NAME" in the namespace "rebootd" and a bound token
#   (kubectl create token) valid for --days.
# Either way it binds the roles from deploy/kubernetes (kubectl apply -k deploy/kubernetes first)
# to that identity: ClusterRoleBinding rebootd-node-NODE, RoleBindings rebootd-lease-NODE (in
# rebootd) and rebootd-events-NODE (in default); with --allow-pod-delete also the ClusterRole
# rebootd-node-pod-delete (ClusterRoleBinding rebootd-node-pod-delete-NODE), which
# [kubernetes] force_delete_after needs. The kubeconfig is written with mode 0600, to be
# copied to the node as /etc/rebootd/kubeconfig (root:root 0600) and named in rebootd's
# configuration:
#   [kubernetes]
#   kubeconfig = "/etc/rebootd/kubeconfig"
# README.md beside this script compares the two modes.
set -euo pipefail

NAMESPACE=rebootd
CLUSTER_ROLE=rebootd-node
POD_DELETE_ROLE=rebootd-node-pod-delete
LEASE_ROLE=rebootd-lease
EVENTS_ROLE=rebootd-events
EVENTS_NAMESPACE=default
SIGNER=kubernetes.io/kube-apiserver-client
MAX_DAYS=365

usage() {
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

fail() {
    echo "$*" >&2
    exit 1
}

mode=csr
days=30
server=
ca_file=
output=
node=
revoke=false
pod_delete=false
while [ $# -gt 0 ]; do
    case "$1" in
    --mode) mode=${2:?}; shift 2 ;;
    --days) days=${2:?}; shift 2 ;;
    --server) server=${2:?}; shift 2 ;;
    --ca-file) ca_file=${2:?}; shift 2 ;;
    --output | -o) output=${2:?}; shift 2 ;;
    --revoke) revoke=true; shift ;;
    --allow-pod-delete) pod_delete=true; shift ;;
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
[ "$days" -le "$MAX_DAYS" ] || { echo "--days must be at most $MAX_DAYS (re-mint instead)" >&2; exit 2; }
# A node name is a DNS subdomain; it becomes part of object and user names below.
if ! [[ "$node" =~ ^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$ ]]; then
    echo "not a Kubernetes node name: $node" >&2
    exit 2
fi
output=${output:-rebootd-$node.kubeconfig}
sa="node-$node"
if [ "$mode" = csr ]; then
    user="rebootd:node:$node"
    subject_flag="--user=$user"
else
    user="system:serviceaccount:$NAMESPACE:$sa"
    subject_flag="--serviceaccount=$NAMESPACE:$sa"
fi

if [ "$revoke" = true ]; then
    kubectl delete clusterrolebinding "rebootd-node-$node" --ignore-not-found
    kubectl delete clusterrolebinding "rebootd-node-pod-delete-$node" --ignore-not-found
    kubectl -n "$NAMESPACE" delete rolebinding "rebootd-lease-$node" --ignore-not-found
    kubectl -n "$EVENTS_NAMESPACE" delete rolebinding "rebootd-events-$node" --ignore-not-found
    if [ "$mode" = token ]; then
        kubectl -n "$NAMESPACE" delete serviceaccount "$sa" --ignore-not-found
    fi
    echo "revoked $user: its bindings are gone (a certificate stays valid until it expires, but grants nothing)" >&2
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077

# The API server address and CA, from the current context unless given.
if [ -z "$server" ]; then
    server=$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')
fi
[ -n "$server" ] || fail "no API server address in the current context; pass --server"
if [ -n "$ca_file" ]; then
    ca_data=$(base64 -w0 <"$ca_file")
else
    ca_data=$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
    if [ -z "$ca_data" ]; then
        ca_path=$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
        [ -n "$ca_path" ] || fail "no cluster CA in the current context; pass --ca-file"
        ca_data=$(base64 -w0 <"$ca_path")
    fi
fi

# The three roles, bound to this node's identity alone.
bind_roles() {
    kubectl create clusterrolebinding "rebootd-node-$node" --clusterrole="$CLUSTER_ROLE" \
        "$subject_flag" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    kubectl -n "$NAMESPACE" create rolebinding "rebootd-lease-$node" --role="$LEASE_ROLE" \
        "$subject_flag" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    kubectl -n "$EVENTS_NAMESPACE" create rolebinding "rebootd-events-$node" --role="$EVENTS_ROLE" \
        "$subject_flag" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    if [ "$pod_delete" = true ]; then
        kubectl create clusterrolebinding "rebootd-node-pod-delete-$node" --clusterrole="$POD_DELETE_ROLE" \
            "$subject_flag" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    fi
}

if [ "$mode" = csr ]; then
    csr_name="rebootd-node-$node"
    expiration=$((days * 86400))
    usages='["digital signature","client auth"]'
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/key.pem" 2>/dev/null
    openssl pkey -in "$work/key.pem" -pubout -out "$work/pub.pem"
    # The user name is the CN; no O: an O would be a group, and no group is meant to be granted.
    openssl req -new -key "$work/key.pem" -subj "/CN=$user" -out "$work/req.pem"
    request=$(base64 -w0 <"$work/req.pem")
    # A CSR object's spec cannot change: replace a leftover from an earlier run.
    kubectl delete csr "$csr_name" --ignore-not-found >/dev/null
    kubectl create -f - >/dev/null <<EOF
apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata:
  name: $csr_name
  labels:
    app.kubernetes.io/name: rebootd
spec:
  request: $request
  signerName: $SIGNER
  expirationSeconds: $expiration
  usages:
    - digital signature
    - client auth
EOF
    # Read it back in one request and check that what would be approved is what was made here:
    # someone who may create CSRs could have replaced it meanwhile (same name; their key, a group
    # such as system:masters in the subject, server auth, ten years).
    kubectl get csr "$csr_name" -o jsonpath='{.metadata.uid}{"\n"}{.metadata.resourceVersion}{"\n"}{.spec.signerName}{"\n"}{.spec.expirationSeconds}{"\n"}{.spec.usages}{"\n"}{.spec.request}{"\n"}' >"$work/csr.txt"
    { read -r uid; read -r rv; read -r got_signer; read -r got_expiration; read -r got_usages; read -r got_request; } <"$work/csr.txt" || true
    refuse() { fail "CSR $csr_name is not the one this script made ($*): not approved"; }
    [ -n "${uid:-}" ] && [ -n "${rv:-}" ] || refuse "no uid or resourceVersion"
    [ "${got_signer:-}" = "$SIGNER" ] || refuse "signer ${got_signer:-none}"
    [ "${got_expiration:-}" = "$expiration" ] || refuse "expirationSeconds ${got_expiration:-none}, not $expiration"
    [ "${got_usages:-}" = "$usages" ] || refuse "usages ${got_usages:-none}, not $usages"
    printf '%s' "${got_request:-}" | base64 -d >"$work/got-req.pem" 2>/dev/null || refuse "the request is not base64"
    openssl req -in "$work/got-req.pem" -noout -verify 2>/dev/null || refuse "the request's signature does not verify"
    got_subject=$(openssl req -in "$work/got-req.pem" -noout -subject -nameopt RFC2253 2>/dev/null) || refuse "the request cannot be read"
    [ "$got_subject" = "subject=CN=$user" ] || refuse "${got_subject:-no subject}, not CN=$user without groups"
    openssl req -in "$work/got-req.pem" -noout -pubkey >"$work/got-pub.pem" 2>/dev/null || refuse "no public key"
    cmp -s "$work/got-pub.pem" "$work/pub.pem" || refuse "another public key"
    [ "$got_request" = "$request" ] || refuse "the request differs from the one made here"
    # Approve that version only (uid and resourceVersion): a CSR replaced after the check is 409.
    cat >"$work/approval.json" <<EOF
{"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
 "metadata": {"name": "$csr_name", "uid": "$uid", "resourceVersion": "$rv"},
 "spec": {"request": "$request", "signerName": "$SIGNER", "expirationSeconds": $expiration,
          "usages": ["digital signature", "client auth"]},
 "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "RebootdMintKubeconfig",
   "message": "checked by mint-kubeconfig.sh: CN=$user, no groups, client auth, $days days"}]}}
EOF
    kubectl replace --raw "/apis/certificates.k8s.io/v1/certificatesigningrequests/$csr_name/approval" \
        -f "$work/approval.json" >/dev/null
    # The signer answers within seconds once approved; give up after a minute.
    cert=
    for _ in $(seq 60); do
        cert=$(kubectl get csr "$csr_name" -o jsonpath='{.status.certificate}')
        [ -z "$cert" ] || break
        sleep 1
    done
    [ -n "$cert" ] || fail "CSR $csr_name was approved but not signed within 60 s (does this cluster sign $SIGNER?)"
    printf '%s' "$cert" | base64 -d >"$work/cert.pem"
    openssl x509 -in "$work/cert.pem" -noout -pubkey >"$work/cert-pub.pem"
    cmp -s "$work/cert-pub.pem" "$work/pub.pem" || fail "the certificate issued for $csr_name is not for the key made here"
    cert_subject=$(openssl x509 -in "$work/cert.pem" -noout -subject -nameopt RFC2253)
    [ "$cert_subject" = "subject=CN=$user" ] || fail "the certificate issued for $csr_name has $cert_subject"
    not_after=$(openssl x509 -in "$work/cert.pem" -noout -enddate | cut -d= -f2)
    credentials="      client-certificate-data: $(base64 -w0 <"$work/cert.pem")
      client-key-data: $(base64 -w0 <"$work/key.pem")"
    bind_roles
    echo "certificate for $user valid until $not_after (re-mint before then), bound to the rebootd roles" >&2
else
    kubectl -n "$NAMESPACE" create serviceaccount "$sa" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    bind_roles
    token=$(kubectl -n "$NAMESPACE" create token "$sa" --duration="$((days * 24))h")
    [ -n "$token" ] || fail "no token for $user"
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
