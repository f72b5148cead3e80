package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

func TestFingerprint(t *testing.T) {
	args := []string{"fingerprint", "--method", "POST", "--path", "/v1/payments", "--tenant", "acme", "--volatile", "/client_ts,/items/*/trace_id"}
	first := runIdem(t, `{"amount":4200,"items":[{"sku":"a","trace_id":"x"}],"client_ts":1}`, args...)
	require.Equal(t, 0, first.code, first.stderr)

	want, err := idem.Request{Method: "POST", Path: "/v1/payments", Tenant: "acme", ContentType: "application/json",
		Body: []byte(`{"amount":4200,"items":[{"sku":"a"}]}`)}.Fingerprint(idem.CanonicalOptions{})
	require.NoError(t, err)
	assert.Equal(t, want.String()+"\n", first.stdout)

	retry := runIdem(t, `{"items":[{"trace_id":"y","sku":"a"}],"client_ts":2,"amount":4.2e3}`, args...)
	assert.Equal(t, first.stdout, retry.stdout)

	changed := runIdem(t, `{"amount":4201,"items":[{"sku":"a"}]}`, args...)
	require.Equal(t, 0, changed.code, changed.stderr)
	assert.NotEqual(t, first.stdout, changed.stdout)

	shown := runIdem(t, `{"items":[{"trace_id":"y","sku":"a"}],"amount":4.2e3}`, append(args, "--show-body")...)
	require.Equal(t, 0, shown.code, shown.stderr)
	assert.Equal(t, first.stdout+`{"amount":4200,"items":[{"sku":"a"}]}`+"\n", shown.stdout)
}

// TestFingerprintRawFlag: --raw prints what the proxy stores for a body
// it cannot canonicalize.
func TestFingerprintRawFlag(t *testing.T) {
	const dup = `{"a":1,"a":2}`
	r := runIdem(t, dup, "fingerprint", "--method", "POST", "--path", "/p", "--tenant", "t", "--raw")
	require.Equal(t, 0, r.code, r.stderr)
	want, err := idem.Request{Method: "POST", Path: "/p", Tenant: "t", ContentType: "application/json", Body: []byte(dup), Raw: true}.
		Fingerprint(idem.CanonicalOptions{})
	require.NoError(t, err)
	assert.Equal(t, want.String()+"\n", r.stdout)
	assert.Equal(t, 1, runIdem(t, dup, "fingerprint", "--method", "POST", "--path", "/p", "--tenant", "t").code)
}

func TestFingerprintRawAndForm(t *testing.T) {
	base := []string{"fingerprint", "--method", "POST", "--path", "/p", "--tenant", ""}
	form := append(base, "--content-type", "application/x-www-form-urlencoded", "--show-body")
	r := runIdem(t, "b=2&a=x+y", form...)
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(r.stdout, "\n")
	require.Len(t, lines, 3)
	assert.Equal(t, "a=x%20y&b=2", lines[1])

	raw := append(base, "--content-type", "text/plain")
	a, b := runIdem(t, "hello", raw...), runIdem(t, "hello ", raw...)
	require.Equal(t, 0, a.code, a.stderr)
	assert.NotEqual(t, a.stdout, b.stdout)

	// An encoded JSON body is hashed as sent, not parsed.
	gz := "\x1f\x8b\x08 still compressed"
	assert.Equal(t, 1, runIdem(t, gz, base...).code)
	coded := runIdem(t, gz, append(base, "--content-encoding", "gzip", "--show-body")...)
	require.Equal(t, 0, coded.code, coded.stderr)
	assert.True(t, strings.HasSuffix(coded.stdout, "\n"+gz+"\n"), coded.stdout)
}

func TestFingerprintFailures(t *testing.T) {
	full := []string{"fingerprint", "--method", "POST", "--path", "/p", "--tenant", "t"}
	cases := []struct {
		name   string
		stdin  string
		args   []string
		code   int
		stderr string
	}{
		{"missing method", "{}", []string{"fingerprint", "--path", "/p", "--tenant", "t"}, 2, "--method is required"},
		{"missing tenant", "{}", []string{"fingerprint", "--method", "POST", "--path", "/p"}, 2, "--tenant is required"},
		{"bad pointer", "{}", append(full, "--volatile", "client_ts"), 2, "Volatile[0]"},
		{"bad profile", "{}", append(full, "--profile", "float"), 2, "unknown canonicalization profile"},
		{"invalid JSON body", `{"a":1,"a":2}`, full, 1, "duplicate_member at byte 7"},
		{"invalid form body", "a=%zz", append(full, "--content-type", "application/x-www-form-urlencoded"), 1, "syntax at byte 2"},
		{"help", "", []string{"fingerprint", "-h"}, 0, "usage: idem fingerprint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runIdem(t, c.stdin, c.args...)
			assert.Equal(t, c.code, r.code)
			assert.Empty(t, r.stdout)
			assert.Contains(t, r.stderr, c.stderr)
		})
	}
}
