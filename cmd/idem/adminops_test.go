package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/idemtest"
)

const adminToken = "tok_0123456789abcdef0123456789"

// tokenFile writes tok to a file of its own and returns its path.
func tokenFile(t *testing.T, tok string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(path, []byte(tok+"\n"), 0o600))
	return path
}

// stuckKey sends a request that the upstream drops after reading it, so
// that its key is left unknown, and returns the key and its record's
// scope as the admin listener lists it.
func stuckKey(t *testing.T, p *daemon, admin, tokFile string) (string, idem.Scope) {
	t.Helper()
	key := newKey()
	require.Equal(t, http.StatusBadGateway, send(t, "POST", p.url+"/fail", `{"amount": 1}`, keyed(key)...).status)
	retry := send(t, "POST", p.url+"/fail", `{"amount": 1}`, keyed(key)...)
	require.Equal(t, http.StatusConflict, retry.status)
	require.Equal(t, "outcome_pending", retry.code(t))

	r := runIdem(t, "", "inspect", "--admin", admin, "--admin-token-file", tokFile, "--state", "unknown", "--json", "--show-keys")
	require.Equal(t, 0, r.code, r.stderr)
	for _, v := range jsonLines(t, r.stdout) {
		if v.Key == key {
			return key, idem.Scope{Tenant: v.Tenant, Endpoint: v.Endpoint, Key: v.Key}
		}
	}
	require.FailNow(t, "the stuck key is not listed", r.stdout)
	return "", idem.Scope{}
}

// getState reads the state of the record at s through the admin listener.
func getState(t *testing.T, admin, tokFile string, s idem.Scope) string {
	t.Helper()
	r := runIdem(t, "", append([]string{"get", "--admin", admin, "--admin-token-file", tokFile, "--json"}, scopeArgs(s)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	var v recordView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	return v.State
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// TestAdminOpsResolveWhileRunning settles stuck keys through a running
// proxy's admin listener, and the next retry gets what the operator said.
func TestAdminOpsResolveWhileRunning(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	tok := tokenFile(t, adminToken)
	p := startProxy(t, u, "--admin-token-file", tok)
	admin := p.adminURL()

	key, scope := stuckKey(t, p, admin, tok)
	assert.Equal(t, "POST /fail", scope.Endpoint)
	assert.Equal(t, "unknown", getState(t, admin, tok, scope))

	// The provider says the operation ran: record its answer.
	body := filepath.Join(t.TempDir(), "body.json")
	require.NoError(t, os.WriteFile(body, []byte(`{"id":"pay_found"}`), 0o644))
	r := runIdem(t, "", append([]string{"resolve", "--admin", admin, "--admin-token-file", tok, "--as", "completed", "--status", "201",
		"--header", "Content-Type: application/json", "--body-file", body, "--reason", "INC-9"}, scopeArgs(scope)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "resolved key hash "+idem.KeyHash(key)+" as completed\n", r.stdout)
	assert.Contains(t, r.stderr, "from=unknown as=completed attempts=1 reason=INC-9 status=201 body_bytes=18 via=admin")

	retry := send(t, "POST", p.url+"/fail", `{"amount": 1}`, keyed(key)...)
	assert.Equal(t, http.StatusCreated, retry.status)
	assert.Equal(t, `{"id":"pay_found"}`, string(retry.body))
	assert.Equal(t, "application/json", retry.header.Get("Content-Type"))
	assert.Equal(t, "true", retry.header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, u.count(auth, key), "nothing ran again")

	r = runIdem(t, "", append([]string{"get", "--admin", admin, "--admin-token-file", tok, "--body"}, scopeArgs(scope)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, `{"id":"pay_found"}`, r.stdout)

	// A completed record is never overwritten, through the server too.
	r = runIdem(t, "", append([]string{"resolve", "--admin", admin, "--admin-token-file", tok, "--as", "released"}, scopeArgs(scope)...)...)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "never overwritten")

	// Another stuck key provably did not run: release it, and the retry
	// runs the operation again.
	key2, scope2 := stuckKey(t, p, admin, tok)
	r = runIdem(t, "", append([]string{"resolve", "--admin", admin, "--admin-token-file", tok, "--as", "released"}, scopeArgs(scope2)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	r = runIdem(t, "", append([]string{"get", "--admin", admin, "--admin-token-file", tok}, scopeArgs(scope2)...)...)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "no record for key hash "+idem.KeyHash(key2))
	assert.Equal(t, http.StatusBadGateway, send(t, "POST", p.url+"/fail", `{"amount": 1}`, keyed(key2)...).status)
	assert.Equal(t, 2, u.count(auth, key2), "the released key ran again")

	r = runIdem(t, "", "stats", "--admin", admin, "--admin-token-file", tok, "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var st storeStats
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	assert.Equal(t, int64(1), st.ByState["completed"])
	assert.Equal(t, int64(1), st.ByState["unknown"])
	assert.NotNil(t, st.DiskBytes)

	overdue := send(t, "GET", admin+"/v1/admin/overdue?limit=10", "", bearer(adminToken)...)
	assert.Equal(t, http.StatusOK, overdue.status)
	assert.Equal(t, "[]\n", string(overdue.body))

	require.Equal(t, 0, p.stop())
	logged := p.stderr.String()
	assert.Contains(t, logged, "operator routes on under /v1/admin/")
	assert.Contains(t, logged, "from=unknown as=completed attempts=1 reason=INC-9 status=201 body_bytes=18 via=admin",
		"the server logs what it did")
	for _, k := range []string{key, key2, adminToken} {
		assert.NotContains(t, logged, k, "a key or the token reached the log")
	}
}

// TestAdminOpsRefusals: a wrong or missing token, or a malformed request,
// is refused with a problem document, and nothing changes.
func TestAdminOpsRefusals(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	tok := tokenFile(t, adminToken)
	p := startProxy(t, u, "--admin-token-file", tok)
	admin := p.adminURL()
	_, scope := stuckKey(t, p, admin, tok)
	resolve := func(body string, header ...string) reply {
		return send(t, "POST", admin+"/v1/admin/resolve", body, header...)
	}
	release := `{"tenant":` + quote(scope.Tenant) + `,"endpoint":` + quote(scope.Endpoint) + `,"key":` + quote(scope.Key) + `,"as":"released"}`

	for name, header := range map[string][]string{
		"no token":    nil,
		"wrong token": bearer(adminToken + "x"),
		"not bearer":  {"Authorization", "Basic " + adminToken},
	} {
		t.Run(name, func(t *testing.T) {
			r := resolve(release, header...)
			assert.Equal(t, http.StatusUnauthorized, r.status)
			assert.Equal(t, "unauthorized", r.code(t))
			assert.Equal(t, `Bearer realm="idem admin"`, r.header.Get("WWW-Authenticate"))
			assert.Equal(t, http.StatusUnauthorized, send(t, "GET", admin+"/v1/admin/records", "", header...).status)
		})
	}
	r := runIdem(t, "", append([]string{"resolve", "--admin", admin, "--admin-token-file", tokenFile(t, "not_the_token_at_all"), "--as", "released"}, scopeArgs(scope)...)...)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "refused the admin token")

	for _, c := range []struct{ name, body, detail string }{
		{"bad as", strings.Replace(release, "released", "maybe", 1), `as "maybe": want released, unknown or completed`},
		{"completed without status", strings.Replace(release, "released", "completed", 1), "as completed needs status between 100 and 999"},
		{"status without completed", strings.Replace(release, `"as"`, `"status":200,"as"`, 1), "go with as completed only"},
		{"header splitting", strings.Replace(release, `"as":"released"`, `"as":"completed","status":200,"header":{"X-A":["1\r\nSet-Cookie: x"]}`, 1), `header "X-A"`},
		{"header name", strings.Replace(release, `"as":"released"`, `"as":"completed","status":200,"header":{"X-A: b":["1"]}`, 1), `header "X-A: b"`},
		{"no key", strings.Replace(release, quote(scope.Key), `""`, 1), "endpoint and key are required"},
		{"unknown member", strings.Replace(release, `"as"`, `"ass":1,"as"`, 1), "unknown field"},
		{"not JSON", "as=released", "invalid character"},
		{"two objects", release + release, "data after its JSON object"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := resolve(c.body, bearer(adminToken)...)
			assert.Equal(t, http.StatusBadRequest, r.status)
			assert.Equal(t, "bad_request", r.code(t))
			var p struct{ Detail string }
			require.NoError(t, json.Unmarshal(r.body, &p))
			assert.Contains(t, p.Detail, c.detail)
		})
	}
	for _, path := range []string{"/v1/admin/records?state=stuck", "/v1/admin/records?created_before=yesterday", "/v1/admin/records?expired=maybe", "/v1/admin/overdue?limit=-1"} {
		r := send(t, "GET", admin+path, "", bearer(adminToken)...)
		assert.Equal(t, http.StatusBadRequest, r.status, path)
		assert.Equal(t, "bad_request", r.code(t), path)
	}
	absent := send(t, "POST", admin+"/v1/admin/record", `{"endpoint":"POST /fail","key":"absent"}`, bearer(adminToken)...)
	assert.Equal(t, http.StatusNotFound, absent.status)
	assert.Equal(t, "record_not_found", absent.code(t))

	assert.Equal(t, "unknown", getState(t, admin, tok, scope), "nothing changed")
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestAdminOpsOff: without a token the operator routes are not served,
// and the tools say why.
func TestAdminOpsOff(t *testing.T) {
	t.Setenv(adminTokenEnv, "")
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u)
	admin := p.adminURL()
	assert.Equal(t, http.StatusNotFound, send(t, "GET", admin+"/v1/admin/records", "", bearer(adminToken)...).status)
	assert.Equal(t, http.StatusNotFound, send(t, "POST", admin+"/v1/admin/resolve", `{}`, bearer(adminToken)...).status)
	assert.Equal(t, http.StatusOK, send(t, "GET", admin+"/healthz", "").status)

	r := runIdem(t, "", "inspect", "--admin", admin, "--admin-token-file", tokenFile(t, adminToken))
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "serves no operator routes")
	require.Equal(t, 0, p.stop())
	assert.Contains(t, p.stderr.String(), "operator routes off: no admin token")
}

// TestAdminToolUsage: every tool that reaches a running server takes
// --admin, alone, with a token.
func TestAdminToolUsage(t *testing.T) {
	t.Setenv(adminTokenEnv, "")
	tok := tokenFile(t, adminToken)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"inspect", "--admin", "http://127.0.0.1:1", "--data", t.TempDir()}, 2, "give it without --data or --store"},
		{[]string{"stats", "--admin", "http://127.0.0.1:1", "--store", "postgres://x@localhost/db"}, 2, "give it without --data or --store"},
		{[]string{"get", "--admin", "127.0.0.1:9464", "--endpoint", "e", "--key", "k"}, 2, "--admin wants the admin listener's URL"},
		{[]string{"inspect", "--admin", "http://127.0.0.1:1"}, 2, "--admin needs the admin token"},
		{[]string{"inspect", "--data", t.TempDir(), "--admin-token-file", tok}, 2, "--admin-token-file goes with --admin URL"},
		{[]string{"inspect", "--admin", "http://127.0.0.1:1", "--admin-token-file", tokenFile(t, "short")}, 2, "it needs at least 16"},
		{[]string{"inspect", "--admin", "http://127.0.0.1:1", "--admin-token-file", tok}, 1, "the admin listener at http://127.0.0.1:1"},
		{[]string{"compact", "--admin", "http://127.0.0.1:1", "--data", t.TempDir()}, 2, "give it without --data or --store"},
		{[]string{"check", "--admin", "http://127.0.0.1:1", "--store", "postgres://x@localhost/db"}, 2, "give it without --data or --store"},
		{[]string{"compact", "--admin", "http://127.0.0.1:1"}, 2, "--admin needs the admin token"},
		{[]string{"check", "--admin", "http://127.0.0.1:1", "--admin-token-file", tok}, 1, "the admin listener at http://127.0.0.1:1"},
	} {
		r := runIdem(t, "", c.args...)
		assert.Equal(t, c.code, r.code, "%v: %s", c.args, r.stderr)
		assert.Contains(t, r.stderr, c.want, c.args)
	}
	for _, tool := range []string{"inspect", "get", "stats", "resolve", "compact", "check"} {
		r := runIdem(t, "", tool, "--help")
		assert.Contains(t, r.stderr, "--admin URL", tool)
	}
	r := runIdem(t, "", "proxy", "--upstream", "http://127.0.0.1:1", "--data", t.TempDir(), "--admin-token-file", filepath.Join(t.TempDir(), "missing"))
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "--admin-token-file: open")
}

// TestAdminOpsCrashedClaim: a claim whose process died is listed as
// overdue once its lease ends, and the client settles it through the
// routes; while the lease runs it is left alone. In process, so that the
// store's clock can be moved past the lease.
func TestAdminOpsCrashedClaim(t *testing.T) {
	db, clock := idemtest.Open(t, nil)
	// A URL given with a trailing slash works as one without.
	c := newAdminClient(adminServer(t, db).base+"/", adminToken)
	t.Cleanup(func() { c.Close() })

	ctx := context.Background()
	s := idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: newKey()}
	_, _, err := db.Claim(ctx, s, idem.Fingerprint{1}) // the process dies before it ends the lease
	require.NoError(t, err)

	_, err = c.Resolve(ctx, s, resolution{As: "released"})
	var ke *idem.KeyError
	require.ErrorAs(t, err, &ke)
	require.ErrorIs(t, err, idem.ErrInProgress)
	assert.Positive(t, ke.RetryAfter)
	got, err := c.Get(ctx, s)
	require.NoError(t, err)
	assert.Equal(t, idem.StateInProgress, got.State, "a live lease is left alone")

	clock.Advance(time.Hour)
	overdue := send(t, "GET", c.base+"/v1/admin/overdue", "", bearer(adminToken)...)
	require.Equal(t, http.StatusOK, overdue.status)
	var listed []recordView
	require.NoError(t, json.Unmarshal(overdue.body, &listed))
	require.Len(t, listed, 1)
	assert.Equal(t, idem.KeyHash(s.Key), listed[0].KeyHash)

	prev, err := c.Resolve(ctx, s, resolution{As: "completed", Response: idem.Response{Status: 200, Body: []byte{0xff, 0}}})
	require.NoError(t, err)
	assert.Equal(t, idem.StateInProgress, prev.State)
	got, err = c.Get(ctx, s)
	require.NoError(t, err)
	assert.Equal(t, idem.StateCompleted, got.State)
	assert.Equal(t, []byte{0xff, 0}, got.Response.Body, "bytes that are not UTF-8 survive")
	assert.Equal(t, uint32(2), got.Attempts)

	_, err = c.Resolve(ctx, s, resolution{As: "released"})
	require.ErrorIs(t, err, idem.ErrCompleted)
	_, err = c.Get(ctx, idem.Scope{Endpoint: "POST /v1/payments", Key: "absent"})
	require.ErrorIs(t, err, idem.ErrNotFound)
}
