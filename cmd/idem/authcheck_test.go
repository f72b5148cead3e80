package main

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAuthCheck: with --auth-check-url a revoked credential stops getting
// its stored answers at once; a check that answers neither yes nor no
// refuses too; the check sees the retry's credentials and what it asks
// for, and the upstream's operation never runs again.
func TestAuthCheck(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	var mu sync.Mutex
	answer := http.StatusNoContent
	var asked []http.Header
	check := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		h := r.Header.Clone()
		h.Set("X-Path", r.URL.RequestURI())
		asked = append(asked, h)
		w.WriteHeader(answer)
	}))
	t.Cleanup(check.Close)
	set := func(status int) { mu.Lock(); answer = status; mu.Unlock() }
	p := startProxy(t, u, "--auth-check-url", check.URL+"/auth?service=idem")

	key := newKey()
	first := send(t, "POST", p.url+"/v1/payments", `{"amount": 1}`, append(keyed(key), "Cookie", "session=s1")...)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	mu.Lock()
	assert.Empty(t, asked, "the first request is not checked")
	mu.Unlock()

	again := send(t, "POST", p.url+"/v1/payments", `{"amount": 1}`, append(keyed(key), "Cookie", "session=s1")...)
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(first.body), string(again.body))
	mu.Lock()
	require.Len(t, asked, 1)
	assert.Equal(t, auth, asked[0].Get("Authorization"))
	assert.Equal(t, "session=s1", asked[0].Get("Cookie"))
	assert.Equal(t, "POST", asked[0].Get("X-Original-Method"))
	assert.Equal(t, "/v1/payments", asked[0].Get("X-Original-URI"))
	assert.Equal(t, "/auth?service=idem", asked[0].Get("X-Path"))
	assert.Empty(t, asked[0].Get("Idempotency-Key"), "the check is about the caller, not the key")
	mu.Unlock()

	for _, c := range []struct {
		status int
		want   string
	}{
		{http.StatusUnauthorized, "replay_forbidden"},
		{http.StatusForbidden, "replay_forbidden"},
		{http.StatusFound, "replay_check_failed"},
		{http.StatusBadGateway, "replay_check_failed"},
	} {
		set(c.status)
		r := send(t, "POST", p.url+"/v1/payments", `{"amount": 1}`, keyed(key)...)
		assert.Equal(t, c.want, r.code(t), c.status)
		assert.NotContains(t, string(r.body), string(first.body), c.status)
	}
	check.Close()
	assert.Equal(t, "replay_check_failed", send(t, "POST", p.url+"/v1/payments", `{"amount": 1}`, keyed(key)...).code(t), "an unreachable check refuses")
	assert.Equal(t, 1, u.count(auth, key), "no refusal runs the operation")

	require.Equal(t, 0, p.stop(), p.stderr.String())
	assert.NotContains(t, p.stderr.String(), "service=idem", "the check's URL stays out of the log")
	assert.NotContains(t, p.stderr.String(), "sk_test_alice")
}

func TestAuthCheckFlag(t *testing.T) {
	for _, bad := range []string{"ftp://x/", "/auth", "http://u:p@x/auth"} {
		r := runIdem(t, "", "proxy", "--upstream", "http://127.0.0.1:1", "--data", t.TempDir(), "--auth-check-url", bad)
		assert.Equal(t, 2, r.code, bad)
		assert.Contains(t, r.stderr, "--auth-check-url", bad)
	}
}
