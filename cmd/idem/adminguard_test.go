package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/idemtest"
)

const readToken = "read_0123456789abcdef0123"

// guarded is the admin listener's handler as the proxy builds it.
func guarded(t *testing.T, g *adminGuard) http.Handler {
	t.Helper()
	db, _ := idemtest.Open(t, nil)
	adm, err := newAdmin(db, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	mux := http.NewServeMux()
	adm.register(mux, g)
	adm.registerOps(mux, g)
	return g.guard(mux)
}

func call(h http.Handler, method, host, path, auth string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(`{}`))
	r.Host = host
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func problemCode(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var p struct{ Code string }
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p), w.Body.String())
	return p.Code
}

// TestAdminHostAllowList: a request whose Host is a name the operator did
// not list (a page whose name was rebound to the listener) gets 421 on
// every path, /metrics included; addresses and localhost are served.
func TestAdminHostAllowList(t *testing.T) {
	h := guarded(t, &adminGuard{hosts: map[string]bool{"idem-admin.internal": true}})
	for _, host := range []string{"127.0.0.1:9464", "[::1]:9464", "10.0.0.7", "localhost:9464", "LOCALHOST.", "idem-admin.internal:9464"} {
		assert.Equal(t, http.StatusOK, call(h, "GET", host, "/metrics", "").Code, host)
	}
	for _, host := range []string{"attacker.example:9464", "idem-admin.internal.attacker.example", ""} {
		w := call(h, "GET", host, "/metrics", "")
		assert.Equal(t, http.StatusMisdirectedRequest, w.Code, host)
		assert.Equal(t, codeHostNotAllowed, problemCode(t, w), host)
		assert.Equal(t, http.StatusMisdirectedRequest, call(h, "GET", host, "/healthz", "").Code, host)
	}
}

// TestAdminTokens: the read token reads and cannot resolve or compact,
// the admin token does both, the scheme's case does not matter, and a
// metrics token closes /metrics to everyone without a token.
func TestAdminTokens(t *testing.T) {
	g := &adminGuard{write: hashToken(adminToken), read: hashToken(readToken), metrics: hashToken("metrics_0123456789abcdef")}
	h := guarded(t, g)
	const host = "127.0.0.1:9464"
	for _, auth := range []string{"Bearer " + readToken, "bearer " + readToken, "BEARER  " + readToken, "Bearer " + adminToken} {
		assert.Equal(t, http.StatusOK, call(h, "GET", host, "/v1/admin/overdue", auth).Code, auth)
	}
	for _, auth := range []string{"", "Basic " + readToken, "Bearer " + readToken + "x", "Bearer"} {
		w := call(h, "GET", host, "/v1/admin/overdue", auth)
		assert.Equal(t, http.StatusUnauthorized, w.Code, auth)
		assert.Equal(t, codeUnauthorized, problemCode(t, w))
	}
	for _, path := range []string{"/v1/admin/resolve", "/v1/admin/compact"} {
		assert.Equal(t, http.StatusUnauthorized, call(h, "POST", host, path, "Bearer "+readToken).Code, path)
		assert.NotEqual(t, http.StatusUnauthorized, call(h, "POST", host, path, "bearer "+adminToken).Code, path)
	}
	assert.Equal(t, http.StatusUnauthorized, call(h, "GET", host, "/metrics", "").Code)
	for _, tok := range []string{"metrics_0123456789abcdef", readToken, adminToken} {
		assert.Equal(t, http.StatusOK, call(h, "GET", host, "/metrics", "Bearer "+tok).Code, tok)
	}
	assert.Equal(t, http.StatusOK, call(h, "GET", host, "/healthz", "").Code, "a probe needs no token")

	readOnly := guarded(t, &adminGuard{read: hashToken(readToken)})
	assert.Equal(t, http.StatusOK, call(readOnly, "GET", host, "/v1/admin/overdue", "Bearer "+readToken).Code)
	assert.Equal(t, http.StatusNotFound, call(readOnly, "POST", host, "/v1/admin/resolve", "Bearer "+readToken).Code,
		"without an admin token nothing can change records")
	assert.Equal(t, http.StatusOK, call(readOnly, "GET", host, "/metrics", "").Code, "/metrics is open without a metrics token")
}

// TestAdminFlags: a token file others can read is reported, and client
// certificates need the listener's own TLS.
func TestAdminFlags(t *testing.T) {
	t.Setenv(adminTokenEnv, "")
	parse := func(args ...string) *adminFlags {
		fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
		f := addAdminFlags(fs)
		require.NoError(t, fs.Parse(args))
		return f
	}
	shared := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(shared, []byte(adminToken), 0o644))
	var stderr strings.Builder
	g, conf, err := parse("--admin-token-file", shared).load(&stderr)
	require.NoError(t, err)
	assert.Nil(t, conf)
	assert.Equal(t, hashToken(adminToken), g.write)
	assert.Contains(t, stderr.String(), "can be read by other users")
	assert.NotContains(t, stderr.String(), adminToken)

	stderr.Reset()
	_, _, err = parse("--admin-read-token-file", tokenFile(t, readToken), "--admin-hosts", " Admin.Internal ,x").load(&stderr)
	require.NoError(t, err)
	assert.Empty(t, stderr.String())

	_, _, err = parse("--admin-client-ca", shared).load(io.Discard)
	assert.ErrorContains(t, err, "--admin-client-ca needs --admin-tls-cert")
	certFile, keyFile, _ := selfSigned(t)
	_, _, err = parse("--admin-tls-cert", certFile, "--admin-tls-key", keyFile, "--admin-client-ca", shared).load(io.Discard)
	assert.ErrorContains(t, err, "no PEM certificate")
	_, conf, err = parse("--admin-tls-cert", certFile, "--admin-tls-key", keyFile, "--admin-client-ca", certFile).load(io.Discard)
	require.NoError(t, err)
	assert.Equal(t, tls.RequireAndVerifyClientCert, conf.ClientAuth)
}
