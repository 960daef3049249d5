#!/bin/sh
# Certificates for docker-compose.yml with TLS (deploy/tls.env.example): a private CA and one leaf per service.
#
#   deploy/make-certs.sh ./certs [PUBLIC_NAME ...]     # e.g. deploy/make-certs.sh ./certs tandem.example.com
#
# DIR/ca.crt                       the CA every hop trusts (give it to clients: SDK root_certificates=, CLI --ca)
# DIR/public.{crt,key}             the scheduler's public endpoint: localhost, 127.0.0.1, scheduler, PUBLIC_NAMEs
# DIR/scheduler.{crt,key}          the scheduler's client certificate towards the model services (mutual TLS)
# DIR/target.{crt,key}, draft.*    the model services: their compose names, localhost, 127.0.0.1
# DIR/ca.key                       keep it elsewhere once the leaves are made
#
# EC P-256 keys; leaves valid DAYS days (default 90). Run it again to renew: the services pick up the new files
# for new connections without a restart (the CA stays unless ca.key is removed first).
set -eu
DIR=${1:?usage: deploy/make-certs.sh DIR [PUBLIC_NAME ...]}
shift
DAYS=${DAYS:-90}
mkdir -p "$DIR"
cd "$DIR"
if [ ! -f ca.key ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 -subj "/CN=tandem-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout ca.key -out ca.crt 2>/dev/null
fi
leaf() { # name, SAN list
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' "$2" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$DAYS" -extfile "$1.ext" \
    -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
PUBLIC="DNS:localhost,IP:127.0.0.1,DNS:scheduler"
for name in "$@"; do PUBLIC="$PUBLIC,DNS:$name"; done
leaf public "$PUBLIC"
leaf scheduler "DNS:scheduler"
leaf target "DNS:target,DNS:localhost,IP:127.0.0.1"
leaf draft "DNS:draft,DNS:localhost,IP:127.0.0.1"
chmod 600 ./*.key
echo "certificates in $DIR (CA: $DIR/ca.crt)"
