package reliability_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/crashtest"
)

// TestHostileDoorsProxy aims the security review's probes at a real idem
// proxy whose tenant header must be signed: a forged or unsigned tenant
// header, a gzip bomb replayed to a client that refuses gzip, an upstream
// that floods headers, and a rebinding Host on the admin listener. None
// may run anything twice, store a flood, inflate a bomb or answer for a
// foreign Host.
func TestHostileDoorsProxy(t *testing.T) {
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	zero := make([]byte, 1<<20)
	for range 64 { // 64 MiB of zeros in about 64 KiB
		zw.Write(zero)
	}
	require.NoError(t, zw.Close())
	var runs atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		switch r.URL.Path {
		case "/bomb":
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Type", "application/json")
			w.Write(bomb.Bytes())
		case "/flood":
			for i := range 2000 {
				w.Header().Set(fmt.Sprintf("X-Flood-%d", i), strings.Repeat("f", 64))
			}
			w.WriteHeader(http.StatusOK)
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"run":%d}`, runs.Load())
		}
	}))
	t.Cleanup(up.Close)

	secret := strings.Repeat("s", 40)
	secretFile := filepath.Join(t.TempDir(), "tenant-secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(secret), 0o600))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	admin := l.Addr().String()
	require.NoError(t, l.Close())
	store := proxyStores[0].new(t)
	proxy, url := startProxy(t, store.args("127.0.0.1:0", up.URL, "--tenant-secret-file", secretFile, "--admin", admin))
	client := newClient()
	signed := func(tenant string) []string {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(ts + "." + tenant))
		return []string{crashtest.TenantHeader, tenant, crashtest.TenantHeader + "-Signature", "t=" + ts + ",v=" + hex.EncodeToString(mac.Sum(nil))}
	}
	post := func(path, key string, header ...string) reply {
		t.Helper()
		r, err := do(context.Background(), client, "POST", url+path, `{"amount":1}`, append([]string{"Idempotency-Key", key}, header...)...)
		require.NoError(t, err)
		return r
	}

	// The victim's answer, and callers who only know its tenant's name.
	victim := post("/v1/charges", "victim-key", signed("victim")...)
	require.Equal(t, http.StatusCreated, victim.status, "%s", victim.body)
	forged := signed("victim")
	forged[3] = "t=" + strconv.FormatInt(time.Now().Unix(), 10) + ",v=" + strings.Repeat("0", 64)
	stale := signed("victim")
	stale[3] = strings.Replace(stale[3], "t=", "t=1", 1)
	for name, h := range map[string][]string{
		"unsigned": {crashtest.TenantHeader, "victim"}, "forged": forged, "stale": stale,
		"signature of another tenant": append([]string{crashtest.TenantHeader, "victim"}, signed("mallory")[2:]...),
	} {
		r := post("/v1/charges", "victim-key", h...)
		assert.Equal(t, http.StatusUnauthorized, r.status, name)
		assert.Equal(t, idem.CodeTenantMissing, r.code(), name)
		assert.NotContains(t, string(r.body), string(victim.body), name)
	}

	// The bomb is stored as it came; a retry refusing gzip is not inflated.
	first := post("/bomb", "bomb-key", append(signed("victim"), "Accept-Encoding", "gzip")...)
	require.Equal(t, http.StatusOK, first.status)
	assert.Len(t, first.body, bomb.Len())
	again := post("/bomb", "bomb-key", append(signed("victim"), "Accept-Encoding", "identity")...)
	assert.Equal(t, http.StatusNotAcceptable, again.status)
	assert.Equal(t, idem.CodeDecodedTooLarge, again.code())

	// The flood is cut off at the transport: the outcome is unknown, never
	// a stored 130 KiB header.
	flood := post("/flood", "flood-key", signed("victim")...)
	assert.Equal(t, http.StatusBadGateway, flood.status)
	assert.Equal(t, idem.CodeOutcomePending, post("/flood", "flood-key", signed("victim")...).code())

	// DNS rebinding: the admin listener answers its own address only.
	for host, want := range map[string]int{"attacker.example": http.StatusMisdirectedRequest, admin: http.StatusOK} {
		req, err := http.NewRequest("GET", "http://"+admin+"/metrics", nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, host)
	}

	assert.EqualValues(t, 3, runs.Load(), "the victim's charge, the bomb and the flood, once each")
	require.NoError(t, proxy.Signal(syscallTERM()))
	code, err := proxy.Wait(guard)
	require.NoError(t, err)
	require.Equal(t, 0, code, proxy.Stderr())
	recs := store.records(t)
	require.Len(t, recs, 3)
	for _, rec := range recs {
		assert.Equal(t, recs[0].Scope.Tenant, rec.Scope.Tenant, "every record is the signed tenant's")
	}
}
