#!/usr/bin/env bash
# Makes a self-signed TLS pair for the SMTP submission service in DIR (default var/smtp-tls):
# cert.pem and key.pem, for localhost and 127.0.0.1, unless both are there already. `make run`
# and the tests use it; production gives its own SMTP_TLS_CERT and SMTP_TLS_KEY.
set -euo pipefail
dir="${1:-var/smtp-tls}"
mkdir -p "$dir"
if [ -s "$dir/cert.pem" ] && [ -s "$dir/key.pem" ]; then
  exit 0
fi
command -v openssl >/dev/null || { echo "smtp-cert: openssl is needed (apt-get install openssl)" >&2; exit 1; }
# An end-entity certificate (CA:FALSE), as rustls and webpki clients expect of a server.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 825 \
  -subj "/CN=localhost" \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -addext "basicConstraints=critical,CA:FALSE" \
  -addext "keyUsage=critical,digitalSignature" \
  -addext "extendedKeyUsage=serverAuth" \
  -keyout "$dir/key.pem.tmp" -out "$dir/cert.pem.tmp" 2>/dev/null
mv "$dir/key.pem.tmp" "$dir/key.pem"
mv "$dir/cert.pem.tmp" "$dir/cert.pem"
