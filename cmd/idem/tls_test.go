package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/idemtest"
)

// selfSigned writes a certificate for 127.0.0.1 and its key as PEM files
// and returns their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestProxyTLS: with --tls-cert and --tls-key the proxy's clients speak
// HTTPS, and the contract holds over it: the first call runs, its retry
// is a replay.
func TestProxyTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u, "--tls-cert", certFile, "--tls-key", keyFile)
	require.True(t, strings.HasPrefix(p.url, "https://"), p.url)

	c := &http.Client{Timeout: guard, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	key := newKey()
	body := `{"amount": 4200, "currency": "usd"}`
	status, _, first, err := idemtest.Send(t.Context(), c, "POST", p.url+"/v1/payments", body, keyed(key)...)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, "%s", first)
	status, h, again, err := idemtest.Send(t.Context(), c, "POST", p.url+"/v1/payments", body, keyed(key)...)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, status)
	assert.Equal(t, "true", h.Get("Idempotent-Replayed"))
	assert.Equal(t, first, again)
	assert.Equal(t, 1, u.count(auth, key))

	// Plain HTTP to the TLS listener gets nowhere near the upstream.
	plain := newKey()
	status, _, _, err = idemtest.Send(t.Context(), client, "POST", "http://"+strings.TrimPrefix(p.url, "https://")+"/v1/payments", body, keyed(plain)...)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Zero(t, u.count(auth, plain), "a plain request was forwarded")
}

// TestTLSFlagsRefused: half a pair, or files that are not one, stop serve
// and proxy before they open a store or listen.
func TestTLSFlagsRefused(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t)
	_, otherKey, _ := selfSigned(t)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"cert alone", []string{"--tls-cert", certFile}, "--tls-cert and --tls-key go together"},
		{"key alone", []string{"--tls-key", keyFile}, "--tls-cert and --tls-key go together"},
		{"mismatched pair", []string{"--tls-cert", certFile, "--tls-key", otherKey}, "--tls-cert, --tls-key:"},
		{"missing file", []string{"--tls-cert", certFile + ".none", "--tls-key", keyFile}, "--tls-cert, --tls-key:"},
	} {
		for _, cmd := range [][]string{
			{"proxy", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", "--admin", ""},
		} {
			t.Run(cmd[0]+"/"+c.name, func(t *testing.T) {
				data := filepath.Join(t.TempDir(), "data")
				r := runIdem(t, "", append(append(cmd, "--data", data), c.args...)...)
				assert.Equal(t, 2, r.code)
				assert.Contains(t, r.stderr, c.want)
				_, err := os.Stat(data)
				assert.ErrorIs(t, err, os.ErrNotExist, "no store was opened")
			})
		}
	}
}
