package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeRoutes writes a --routes file and returns its path.
func writeRoutes(t *testing.T, text string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "routes.json")
	require.NoError(t, os.WriteFile(file, []byte(text), 0o600))
	return file
}

func TestReadRoutesRefusesBadFiles(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"not an object", `["POST /x"]`, "routes.json:1: want a JSON object"},
		{"syntax", "{\n\"POST /x\": {\"ttl\": \"1h\",}\n}", `routes.json:2: route "POST /x": invalid character '}'`},
		{"unknown field", "{\n\"POST /a\": {},\n\"POST /x\": {\"tll\": \"1h\"}\n}", `routes.json:3: route "POST /x": json: unknown field "tll"`},
		{"wrong type", "{\n\"POST /x\": {\"require\": \"POST\"}\n}", `routes.json:2: route "POST /x": json: cannot unmarshal string into Go struct field routeSettings.require`},
		{"pattern", "{\n\n\"POST /x/{id\": {}\n}", `routes.json:3: route "POST /x/{id": parsing "POST /x/{id"`},
		{"same pattern twice", "{\"POST /x\": {},\n\"POST /x\": {}}", `routes.json:2: route "POST /x": pattern "POST /x"`},
		{"conflict", "{\"POST /x/{a}\": {},\n\"/{b}/y\": {}}", "conflicts with pattern"},
		{"ttl", "{\"POST /x\": {\"ttl\": \"two days\"}}", `routes.json:1: route "POST /x": ttl: "two days" is not a duration`},
		{"short ttl", "{\"POST /x\": {\"ttl\": \"1m\"}}", "ttl 1m0s must be at least 10 leases (5m0s)"},
		{"volatile", "{\"POST /x\": {\"volatile\": [\"sent_at\"]}}", `route "POST /x": volatile: idem: CanonicalOptions.Volatile[0]`},
		{"status", "{\"POST /x\": {\"release_status\": \"4xx,5\"}}", `route "POST /x": release_status: "5" is not a status`},
		{"empty method", "{\"POST /x\": {\"require\": [\"\"]}}", "require: a method is empty"},
		{"replay", "{\"POST /x\": {\"replay\": \"body\"}}", `route "POST /x": replay: "body": want all, public or status`},
		{"trailing data", "{} {}", "routes.json:1: data after"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := readRoutes(writeRoutes(t, c.text), 5*time.Minute)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// TestProxyRoutes: each route gets its own settings, matched by
// ServeMux's rules on the cleaned path, and a request no route matches
// gets the flags'.
func TestProxyRoutes(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	file := writeRoutes(t, `{
  "POST /v1/charges/{id}": {"ttl": "48h", "volatile": ["/sent_at"]},
  "POST /v1/charges/{id}/capture": {"release_status": "201"},
  "/v1/notes/": {"require": []},
  "PUT /v1/things/{id}": {"require": ["put"]}
}`)
	p := startProxy(t, u, "--routes", file)

	key := newKey()
	first := send(t, "POST", p.url+"/v1/charges/ch_1", `{"amount":1,"sent_at":1}`, keyed(key)...)
	assert.Equal(t, http.StatusCreated, first.status)
	r := send(t, "POST", p.url+"/v1//charges/./ch_1", `{"amount":1,"sent_at":2}`, keyed(key)...)
	assert.Equal(t, http.StatusUnprocessableEntity, r.status, "the path is part of the fingerprint")
	r = send(t, "POST", p.url+"/v1/charges/ch_1", `{"amount":1,"sent_at":2}`, keyed(key)...)
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"), "the route's volatile member is left out")
	assert.Equal(t, string(first.body), string(r.body))

	// The more specific pattern wins, with its own policy.
	key = newKey()
	send(t, "POST", p.url+"/v1/charges/ch_1/capture", `{}`, keyed(key)...)
	send(t, "POST", p.url+"/v1/charges/ch_1/capture", `{}`, keyed(key)...)
	assert.Equal(t, 2, u.count(auth, key), "the capture route releases 201")

	r = send(t, "POST", p.url+"/v1/notes/n_1", `{}`, "Authorization", auth)
	assert.Equal(t, http.StatusCreated, r.status, "no key needed on the notes route")
	key = newKey()
	send(t, "POST", p.url+"/v1/notes/n_1", `{}`, keyed(key)...)
	r = send(t, "POST", p.url+"/v1/notes/n_1", `{}`, keyed(key)...)
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"), "a key, when sent, still protects")

	assert.Equal(t, "idempotency_key_missing", send(t, "PUT", p.url+"/v1/things/t_1", `{}`, "Authorization", auth).code(t))
	assert.Equal(t, "idempotency_key_missing", send(t, "POST", p.url+"/v1/other", `{}`, "Authorization", auth).code(t),
		"a path no route matches gets --require")
	r = send(t, "POST", p.url+"/v1/charges/ch_1", `{"amount":1,"sent_at":1}`, "Authorization", auth)
	assert.Equal(t, "idempotency_key_missing", r.code(t))

	// The charge route's keys are stored under its pattern, for its TTL.
	require.Equal(t, 0, p.stop())
	sum := sha256.Sum256([]byte(auth))
	g := runIdem(t, "", "get", "--data", p.data, "--json", "--tenant", hex.EncodeToString(sum[:]),
		"--endpoint", "POST /v1/charges/{id}", "--key", first.header.Get("Idempotency-Key"))
	require.Equal(t, 0, g.code, g.stderr)
	rec := decode(t, []byte(g.stdout))
	created, err := time.Parse(time.RFC3339Nano, rec["created_at"].(string))
	require.NoError(t, err)
	expires, err := time.Parse(time.RFC3339Nano, rec["expires_at"].(string))
	require.NoError(t, err)
	assert.Equal(t, 48*time.Hour, expires.Sub(created))
	assert.Equal(t, expires.UTC().Format(http.TimeFormat), first.header.Get("Idempotency-Key-Expires"), "the answer says when its key expires")
}

func TestProxyRoutesFileErrors(t *testing.T) {
	r := runIdem(t, "", "proxy", "--data", t.TempDir(), "--upstream", "http://x",
		"--routes", writeRoutes(t, "{\n\"POST /x\": {\"release_status\": \"503\"}\n}"), "--unknown-status", "5xx")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, `routes.json:2: route "POST /x": idem: invalid options: idemhttp: Options.Outcomes: status 503 is in both Release and Unknown`)
	r = runIdem(t, "", "proxy", "--data", t.TempDir(), "--upstream", "http://x", "--routes", filepath.Join(t.TempDir(), "none.json"))
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "none.json: no such file")
}

// TestProxyReplayPolicy: a route whose answers hold secrets keeps only
// their status; its retries get 410 with it and run nothing, while other
// routes replay whole.
func TestProxyReplayPolicy(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u, "--routes", writeRoutes(t, `{"POST /v1/api-keys": {"replay": "status", "replay_headers": ["Location"]}}`))
	key := newKey()
	first := send(t, "POST", p.url+"/v1/api-keys", `{}`, keyed(key)...)
	require.Equal(t, http.StatusCreated, first.status)
	r := send(t, "POST", p.url+"/v1/api-keys", `{}`, keyed(key)...)
	assert.Equal(t, http.StatusGone, r.status)
	assert.Equal(t, "response_body_omitted", r.code(t))
	assert.Contains(t, string(r.body), `"original_status":201`)
	assert.NotContains(t, string(r.body), string(first.body))
	assert.Equal(t, first.header.Get("Location"), r.header.Get("Location"), "the route keeps Location beside the status")
	assert.Empty(t, r.header.Values("X-Upstream"))
	assert.Equal(t, 1, u.count(auth, key))

	other := newKey()
	first = send(t, "POST", p.url+"/v1/payments", `{}`, keyed(other)...)
	assert.Equal(t, string(first.body), string(send(t, "POST", p.url+"/v1/payments", `{}`, keyed(other)...).body))

	bad := runIdem(t, "", "proxy", "--upstream", "http://127.0.0.1:1", "--data", t.TempDir(), "--replay", "some")
	assert.Equal(t, 2, bad.code)
	assert.Contains(t, bad.stderr, `--replay "some": want all, public or status`)
}

// TestProxyRawFallback: a body the upstream may accept but that cannot be
// canonicalized is fingerprinted raw, unless --strict-canonical or the
// route's strict_canonical says to refuse it.
func TestProxyRawFallback(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	file := writeRoutes(t, `{"POST /strict": {"strict_canonical": true}}`)
	p := startProxy(t, u, "--routes", file)
	for _, body := range []string{`{"a":1,"a":2}`, `{"a":NaN}`, strings.Repeat("[", 200) + strings.Repeat("]", 200)} {
		key := newKey()
		first := send(t, "POST", p.url+"/v1/things", body, append(keyed(key), "Content-Type", "application/json")...)
		assert.Equal(t, http.StatusCreated, first.status, body)
		r := send(t, "POST", p.url+"/v1/things", body, append(keyed(key), "Content-Type", "application/json")...)
		assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"), body)
		assert.Equal(t, string(first.body), string(r.body))
		r = send(t, "POST", p.url+"/v1/things", body+" ", append(keyed(key), "Content-Type", "application/json")...)
		assert.Equal(t, http.StatusUnprocessableEntity, r.status, "raw: other bytes are another request")
		assert.Equal(t, 1, u.count(auth, key))
	}
	form := append(keyed(newKey()), "Content-Type", "application/x-www-form-urlencoded")
	assert.Equal(t, http.StatusCreated, send(t, "POST", p.url+"/v1/things", "discount=10%", form...).status)

	r := send(t, "POST", p.url+"/strict", `{"a":1,"a":2}`, append(keyed(newKey()), "Content-Type", "application/json")...)
	assert.Equal(t, "request_body_invalid", r.code(t))

	strict := startProxy(t, u, "--strict-canonical")
	r = send(t, "POST", strict.url+"/v1/things", `{"a":1,"a":2}`, append(keyed(newKey()), "Content-Type", "application/json")...)
	assert.Equal(t, "request_body_invalid", r.code(t))
}
