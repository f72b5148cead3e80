package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
	memtest "github.com/idemkv/idem/internal/idemtest"
)

// startProxyOn starts a proxy on the store in dir, with the admin token in
// tokFile.
func startProxyOn(t *testing.T, dir, tokFile string) *daemon {
	t.Helper()
	u := newUpstream(t)
	u.Start()
	return startDaemon(t, "proxy", "--data", dir, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--upstream", u.URL, "--admin-token-file", tokFile)
}

// TestAdminCheck: idem check --admin reports what idem check reports with
// the store open, from a proxy that runs on it.
func TestAdminCheck(t *testing.T) {
	dir := seededDir(t)
	breakStore(t, dir)
	local := runIdem(t, "", "check", "--data", dir)
	require.Equal(t, 1, local.code, local.stderr)
	localJSON := runIdem(t, "", "check", "--data", dir, "--json")
	require.Equal(t, 1, localJSON.code, localJSON.stderr)

	tok := tokenFile(t, adminToken)
	p := startProxyOn(t, dir, tok)
	admin := p.adminURL()
	r := runIdem(t, "", "check", "--admin", admin, "--admin-token-file", tok)
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Equal(t, local.stdout, r.stdout)
	assert.Contains(t, r.stdout, "3 problems")
	assert.Empty(t, r.stderr)

	r = runIdem(t, "", "check", "--admin", admin, "--admin-token-file", tok, "--json")
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Equal(t, localJSON.stdout, r.stdout)
	assert.Equal(t, localJSON.stderr, r.stderr)

	r = runIdem(t, "", "check", "--admin", admin, "--admin-token-file", tokenFile(t, "not_the_token_at_all"))
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "refused the admin token")
	assert.Empty(t, r.stdout, "a refusal prints no summary")
	require.Equal(t, 0, p.stop())
}

// TestAdminCompact: idem compact --admin has a running proxy sweep and
// compact its store, showing its progress.
func TestAdminCompact(t *testing.T) {
	dir := seededDir(t) // with one expired record
	tok := tokenFile(t, adminToken)
	p := startProxyOn(t, dir, tok)
	admin := p.adminURL()

	r := runIdem(t, "", "compact", "--admin", admin, "--admin-token-file", tok)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^swept 1 expired records \(\d+ B\) through the admin listener at `+admin+"\n$", r.stdout)
	assert.Contains(t, r.stderr, "sweep: 0/1\n")
	assert.Contains(t, r.stderr, "compact: ")

	r = runIdem(t, "", "compact", "--admin", admin, "--admin-token-file", tok)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "swept 0 expired records (0 B) through the admin listener at "+admin+"\n", r.stdout)

	r = runIdem(t, "", "check", "--admin", admin, "--admin-token-file", tok)
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "checked 6 records")
	require.Equal(t, 0, p.stop())
	assert.Contains(t, p.stderr.String(), "compacted through the admin listener")
}

// TestAdminMaintenance: the routes on a store whose records expire on a
// fake clock, on a store without a consistency check, and without the
// token.
func TestAdminMaintenance(t *testing.T) {
	db, clock := memtest.Open(t, nil)
	c := adminServer(t, db)
	ctx := context.Background()
	for range 3 {
		l, _, err := db.Claim(ctx, idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: newKey()}, idem.Fingerprint{1})
		require.NoError(t, err)
		require.NoError(t, l.Complete(ctx, idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}))
	}

	res, err := c.Compact(ctx, nil)
	require.NoError(t, err)
	assert.Zero(t, res.Records, "nothing has expired yet")

	clock.Advance(25 * time.Hour) // past the default TTL
	var phases []string
	res, err = c.Compact(ctx, func(p idem.CompactProgress) {
		if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
			phases = append(phases, p.Phase)
		}
		assert.LessOrEqual(t, p.Done, p.Total)
	})
	require.NoError(t, err)
	assert.Equal(t, 3, res.Records)
	assert.Positive(t, res.Bytes)
	assert.Equal(t, []string{"sweep", "compact"}, phases)

	check, err := c.Check(ctx)
	require.NoError(t, err)
	assert.True(t, check.OK())
	assert.Zero(t, check.Records, "the swept records are gone")

	// A store with no consistency check, such as PostgreSQL's.
	mem, err := idemtest.NewMemStore(nil)
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	_, err = adminServer(t, mem).Check(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "has no consistency check")
	assert.Contains(t, err.Error(), "(check_unsupported)")

	for _, route := range []struct{ method, path string }{{"POST", "/v1/admin/compact"}, {"GET", "/v1/admin/check"}} {
		r := send(t, route.method, c.base+route.path, "")
		assert.Equal(t, http.StatusUnauthorized, r.status, route.path)
		assert.Equal(t, "unauthorized", r.code(t), route.path)
		r = send(t, route.method, c.base+route.path, "", bearer(adminToken+"x")...)
		assert.Equal(t, http.StatusUnauthorized, r.status, route.path)
	}
	r := send(t, "GET", c.base+"/v1/admin/compact", "", bearer(adminToken)...)
	assert.Equal(t, http.StatusMethodNotAllowed, r.status, "compacting changes the store: POST only")
}

// adminServer serves db's operator routes and returns a client of them.
func adminServer(t *testing.T, db idem.Operator) *adminClient {
	t.Helper()
	adm, err := newAdmin(db, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	mux := http.NewServeMux()
	adm.registerOps(mux, &adminGuard{write: hashToken(adminToken)})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := newAdminClient(srv.URL, adminToken)
	t.Cleanup(func() { c.Close() })
	return c
}
