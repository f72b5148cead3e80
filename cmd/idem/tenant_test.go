package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const tenantSecret = "secret_0123456789abcdef0123456789abcdef"

func secretFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tenant-secret")
	require.NoError(t, os.WriteFile(path, []byte(tenantSecret+"\n"), 0o600))
	return path
}

// TestTenantFromAuthIsKeyed: with a secret, the tenant of a credential is
// its HMAC under the secret, which nobody without the secret can compute
// from a guessed credential; without one it is the plain SHA-256, and the
// proxy says so at start.
func TestTenantFromAuthIsKeyed(t *testing.T) {
	t.Setenv(tenantSecretEnv, "")
	r := httptest.NewRequest("POST", "/v1/payments", nil)
	r.Header.Set("Authorization", auth)

	plain, err := parseTenantFrom("auth")
	require.NoError(t, err)
	require.NoError(t, plain.loadSecret(""))
	got, err := plain.tenant(r)
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(auth))
	assert.Equal(t, hex.EncodeToString(sum[:]), got)
	assert.Contains(t, plain.warning(), "guessed offline")

	keyed, err := parseTenantFrom("auth")
	require.NoError(t, err)
	require.NoError(t, keyed.loadSecret(secretFile(t)))
	got, err = keyed.tenant(r)
	require.NoError(t, err)
	mac := hmac.New(sha256.New, []byte(tenantSecret))
	mac.Write([]byte(auth))
	assert.Equal(t, hex.EncodeToString(mac.Sum(nil)), got)
	assert.Empty(t, keyed.warning())

	short := filepath.Join(t.TempDir(), "short")
	require.NoError(t, os.WriteFile(short, []byte("too short"), 0o600))
	assert.ErrorContains(t, keyed.loadSecret(short), "needs at least 32")
}

// TestTenantHeaderNeedsTheGatewaysSignature: with a secret, a tenant
// header counts only with a fresh signature of its value; a client that
// sets another account's header, or replays an old signature, gets no
// tenant. Without a secret the header is trusted and the proxy warns.
func TestTenantHeaderNeedsTheGatewaysSignature(t *testing.T) {
	t.Setenv(tenantSecretEnv, tenantSecret)
	ten, err := parseTenantFrom("header:X-Account")
	require.NoError(t, err)
	require.NoError(t, ten.loadSecret(""))
	now := time.Unix(1_800_000_000, 0)
	ten.now = func() time.Time { return now }
	secret := []byte(tenantSecret)
	req := func(account, sig string) *http.Request {
		r := httptest.NewRequest("POST", "/v1/payments", nil)
		r.Header.Set("X-Account", account)
		if sig != "" {
			r.Header.Set("X-Account-Signature", sig)
		}
		return r
	}
	got, err := ten.tenant(req("acct_1", sign(secret, "acct_1", now.Add(-time.Minute))))
	require.NoError(t, err)
	assert.Equal(t, "acct_1", got)
	for name, r := range map[string]*http.Request{
		"unsigned":               req("acct_1", ""),
		"signed for another":     req("acct_2", sign(secret, "acct_1", now)),
		"stale":                  req("acct_1", sign(secret, "acct_1", now.Add(-signatureSkew-time.Second))),
		"from the future":        req("acct_1", sign(secret, "acct_1", now.Add(signatureSkew+time.Second))),
		"another secret":         req("acct_1", sign([]byte("another secret of thirty-two chars"), "acct_1", now)),
		"malformed":              req("acct_1", "v=00,t=1"),
		"timestamp not a number": req("acct_1", "t=x,v=00"),
	} {
		_, err := ten.tenant(r)
		assert.ErrorIs(t, err, errBadSignature, name)
	}
	assert.Empty(t, ten.warning())

	t.Setenv(tenantSecretEnv, "")
	trusting, err := parseTenantFrom("header:X-Account")
	require.NoError(t, err)
	require.NoError(t, trusting.loadSecret(""))
	got, err = trusting.tenant(req("acct_1", ""))
	require.NoError(t, err)
	assert.Equal(t, "acct_1", got)
	assert.Contains(t, trusting.warning(), "trusts a header any client can set")
}

// TestProxyRefusesAForgedTenantHeader: through the proxy, an unsigned
// tenant header gets 401 and never reaches the upstream; the gateway's
// signed one is served.
func TestProxyRefusesAForgedTenantHeader(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u, "--tenant-from", "header:X-Account", "--tenant-secret-file", secretFile(t))
	key := newKey()
	before := u.total()
	r := send(t, "POST", p.url+"/v1/payments", `{}`, "Idempotency-Key", key, "X-Account", "acct_victim")
	assert.Equal(t, http.StatusUnauthorized, r.status)
	assert.Equal(t, "tenant_missing", r.code(t))
	assert.Equal(t, before, u.total())
	r = send(t, "POST", p.url+"/v1/payments", `{}`, "Idempotency-Key", key, "X-Account", "acct_victim",
		"X-Account-Signature", sign([]byte(tenantSecret), "acct_victim", time.Now()))
	assert.Equal(t, http.StatusCreated, r.status, "%s", r.body)
}
