#!/usr/bin/env bash
# usage: tls_test.sh DUET_BINARY WORK_DIR
# HTTPS (--ssl-certfile, --ssl-keyfile) and client certificates (--ssl-ca-certs, --ssl-cert-reqs)
# with certificates made here by openssl: curl, the official openai npm client and `duet bench
# serve` over TLS, a file downloaded in pieces, a client that leaves (with TLS's closing alert)
# aborts its request, plain HTTP on the TLS port is refused without harm, and half or wrong TLS
# settings stop the start with the setting's name.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

# A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA.
cert() {  # cert NAME SUBJECT [EXTENSION]
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2> /dev/null &&
    printf '%s\n' "${3:-basicConstraints=CA:FALSE}" > "$1.ext" &&
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$1.pem" -days 2 \
      -extfile "$1.ext" 2> /dev/null
}
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=duet test CA" 2> /dev/null \
  && cert server /CN=127.0.0.1 "subjectAltName=IP:127.0.0.1" && cert client "/CN=a client" \
  && cert elsewhere /CN=elsewhere.example "subjectAltName=DNS:elsewhere.example" \
  && openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.pem -days 2 -subj /CN=other 2> /dev/null \
  && openssl pkey -in server.key -aes256 -passout pass:secret -out encrypted.key 2> /dev/null \
  || { echo "FAIL: openssl could not make the certificates"; exit 1; }

# A model slow enough that a stream is still running when its client leaves.
"$duet" make-model --preset tiny --type q8_0 --seed 3 --n-embd 512 --n-ff 1536 --n-layer 6 --n-head 8 --n-head-kv 8 \
  --ctx 4096 -o slow.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=slow.gguf
TLS=(--ssl-certfile server.pem --ssl-keyfile server.key)
start_server tls "${TLS[@]}" || exit 1
grep -q "listening on https://127.0.0.1:$PORT" tls.err && pass "it says https" || failed "listening line: $(head -2 tls.err)"
url="https://127.0.0.1:$PORT"
C=(curl -s --cacert ca.pem)

status=$("${C[@]}" -o resp.json -w "%{http_code}" "$url/v1/completions" -H "Content-Type: application/json" \
  -d '{"prompt": "Hello", "max_tokens": 3}')
[ "$status" = 200 ] && grep -q '"text_completion"' resp.json && pass "a completion over HTTPS" \
  || failed "HTTPS completion: $status $(head -c 300 resp.json)"
"${C[@]}" -N "$url/v1/chat/completions" -H "Content-Type: application/json" \
  -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": true}' > stream.txt
grep -q "^data: \[DONE\]" stream.txt && pass "a stream over HTTPS" || failed "HTTPS stream: $(head -c 300 stream.txt)"
status=$(curl -s -o /dev/null -w "%{http_code}" -m 5 "$url/health")
[ "$status" = 000 ] && pass "a client that does not trust the certificate gets no answer" || failed "untrusted: $status"
curl -s -m 5 -o /dev/null "http://127.0.0.1:$PORT/health"; rc=$?
[ "$rc" != 0 ] && pass "plain HTTP on the TLS port is refused (curl $rc)" || failed "plain HTTP on the TLS port answered"
printf 'GET /health HTTP/1.1\r\n\r\n' | timeout 5 $py -c "
import socket, sys
s = socket.create_connection(('127.0.0.1', $PORT)); s.sendall(sys.stdin.buffer.read()); s.settimeout(4); s.recv(100)"
status=$("${C[@]}" -o /dev/null -w "%{http_code}" "$url/health")
[ "$status" = 200 ] && pass "the server serves on after a client that spoke no TLS" || failed "after plain bytes: $status"

# A file's download goes out in pieces as the socket drains (12 of them here), through TLS.
head -c 3000000 /dev/urandom > blob.jsonl
fid=$("${C[@]}" -F purpose=batch -F "file=@blob.jsonl" "$url/v1/files" | $py -c 'import json,sys; print(json.load(sys.stdin)["id"])' 2>/dev/null)
"${C[@]}" -o blob.back "$url/v1/files/$fid/content"
cmp -s blob.jsonl blob.back && pass "a 3 MB file downloaded over HTTPS, byte for byte" \
  || failed "HTTPS download of $fid: $(stat -c %s blob.back 2>/dev/null) bytes"

# The official client, trusting the CA through Node's own setting.
(cd "$here" && NODE_EXTRA_CA_CERTS="$work/ca.pem" node --input-type=module -e "
import OpenAI from 'openai';
const client = new OpenAI({baseURL: '$url/v1', apiKey: 'none'});
const r = await client.chat.completions.create({model: 'slow.gguf', messages: [{role: 'user', content: 'Hi'}], max_tokens: 3});
let streamed = 0;
for await (const chunk of await client.completions.create({model: 'slow.gguf', prompt: 'Hi', max_tokens: 3, stream: true})) streamed++;
if (!r.choices[0].message || streamed < 3) { console.log('unexpected', JSON.stringify(r), streamed); process.exit(1); }
") > node.txt 2>&1 && pass "the openai npm client over HTTPS" || failed "openai client over HTTPS: $(tail -5 node.txt)"

# A client that sends TLS's closing alert and then closes while its (not streamed) completion
# runs: the alert is data waiting on the socket, so readiness no longer tells the end of the
# connection, and the request must still be aborted (streams also notice when a write fails).
aborted() {
  "${C[@]}" "$url/metrics" | grep -E '^vllm:request_success_total\{.*finished_reason="abort"' | awk '{s += $2} END {print s + 0}'
}
running() { "${C[@]}" "$url/metrics" | grep -E '^vllm:num_requests_running\{' | awk '{s += $2} END {print s + 0}'; }
before=$(aborted)
$py - "$PORT" <<'PY' > leave.txt 2>&1 &
import json, socket, ssl, sys, time
ctx = ssl.create_default_context(cafile="ca.pem")
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[1]))), server_hostname="127.0.0.1")
body = json.dumps({"prompt": "Tell a story", "max_tokens": 3000, "ignore_eos": True}).encode()
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
          % len(body) + body)
open("sent", "w").close()
while True:
    try:
        open("leave").close()
        break
    except FileNotFoundError:
        time.sleep(0.05)
s.settimeout(1)
try:
    s.unwrap()  # sends close_notify; the server, generating, does not answer it
except (OSError, ssl.SSLError):
    pass
s.close()
print("left")
PY
client=$!
for _ in $(seq 1 100); do [ -f sent ] && [ "$(running)" -ge 1 ] && break; sleep 0.1; done
touch leave
wait "$client"
for _ in $(seq 1 50); do [ "$(aborted)" -gt "$before" ] && break; sleep 0.2; done
[ "$(aborted)" -gt "$before" ] && [ "$(running)" = 0 ] && pass "a TLS client that leaves mid-request aborts it" \
  || failed "the request of a TLS client that left was not aborted (running $(running)): $(cat leave.txt)"
# duet's own benchmark client over HTTPS: trusting the CA it works (and reads /metrics over TLS);
# without it the handshake fails.
"$duet" bench serve --base-url "$url" --cacert ca.pem --model slow.gguf -n 6 -c 3 --input-len 8 --output-len 3 \
  > bench.out 2> bench.err
grep -qE "^Successful requests: +6" bench.out && grep -qE "^Failed requests: +0" bench.out \
  && pass "duet bench serve over HTTPS" || failed "bench serve over HTTPS: $(tail -3 bench.err) $(head -8 bench.out)"
"$duet" bench serve --base-url "$url" --model slow.gguf -n 2 --input-len 8 --output-len 3 > /dev/null 2> bench.err
grep -q "certificate verify failed" bench.err && pass "bench serve without the CA: the certificate is not trusted" \
  || failed "bench serve without the CA: $(tail -2 bench.err)"
kill -TERM "$PID"; wait "$PID"

# A server whose certificate (signed by the trusted CA) names another host: bench serve refuses it.
start_server elsewhere --ssl-certfile elsewhere.pem --ssl-keyfile elsewhere.key || exit 1
"$duet" bench serve --base-url "https://127.0.0.1:$PORT" --cacert ca.pem --model slow.gguf -n 2 --input-len 8 \
  --output-len 3 > /dev/null 2> bench.err
grep -q "certificate verify failed" bench.err && pass "bench serve to a host the certificate does not name: refused" \
  || failed "bench serve, certificate for another host: $(tail -2 bench.err)"
kill -TERM "$PID"; wait "$PID"

# Client certificates required.
start_server mtls "${TLS[@]}" --ssl-ca-certs ca.pem --ssl-cert-reqs 2 || exit 1
url="https://127.0.0.1:$PORT"
status=$("${C[@]}" -o /dev/null -w "%{http_code}" "$url/health")
[ "$status" = 000 ] && pass "without a client certificate: no answer" || failed "mTLS without a certificate: $status"
status=$("${C[@]}" -o /dev/null -w "%{http_code}" --cert other.pem --key other.key "$url/health")
[ "$status" = 000 ] && pass "a certificate of another CA: no answer" || failed "mTLS, foreign certificate: $status"
status=$("${C[@]}" -o /dev/null -w "%{http_code}" --cert client.pem --key client.key "$url/health")
[ "$status" = 200 ] && pass "with the CA's client certificate: 200" || failed "mTLS with a certificate: $status"
kill -TERM "$PID"; wait "$PID"

# Settings that cannot work stop the start, naming the setting.
while IFS='|' read -r args message; do
  read -r -a a <<< "$args"
  timeout 60 "$duet" serve --model slow.gguf --port 0 "${a[@]}" < /dev/null > bad.out 2> bad.err; rc=$?
  [ "$rc" = 1 ] && grep -qF -- "$message" bad.err && pass "refused: $args" || failed "'$args': $rc $(tail -2 bad.err)"
done <<'CASES'
--ssl-certfile server.pem|needs both --ssl-certfile and --ssl-keyfile
--ssl-certfile server.pem --ssl-keyfile other.key|--ssl-keyfile 'other.key'
--ssl-certfile server.pem --ssl-keyfile encrypted.key|the key is encrypted
--ssl-certfile missing.pem --ssl-keyfile server.key|--ssl-certfile 'missing.pem'
--ssl-certfile server.pem --ssl-keyfile server.key --ssl-cert-reqs 2|needs HTTPS (--ssl-certfile, --ssl-keyfile) and --ssl-ca-certs
--ssl-certfile server.pem --ssl-keyfile server.key --ssl-ca-certs ca.pem --ssl-cert-reqs 3|--ssl-cert-reqs is 3
CASES

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
