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
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
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

// TestTLSConfig: TLS 1.2 clients get AEAD suites alone, and a renewed
// certificate is served at the next handshake without a restart, while a
// broken renewal leaves the previous one in use.
func TestTLSConfig(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t)
	var logs strings.Builder
	cert, key := certFile, keyFile
	conf, err := (&tlsFlags{cert: &cert, key: &key}).config(&logs)
	require.NoError(t, err)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	// served returns the certificate a handshake with client gets, or the
	// handshake's error.
	served := func(client *tls.Config) ([]byte, error) {
		client.InsecureSkipVerify = true // which certificate is served is the question here
		c, err := tls.Dial("tcp", ln.Addr().String(), client)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Raw, nil
	}
	der := func(file string) []byte {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		p, _ := pem.Decode(b)
		require.NotNil(t, p)
		return p.Bytes
	}

	first, err := served(&tls.Config{})
	require.NoError(t, err)
	assert.Equal(t, der(certFile), first)
	_, err = served(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}})
	assert.Error(t, err, "CBC with SHA-1 is not offered")
	_, err = served(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}})
	assert.NoError(t, err)

	renewedCert, renewedKey, _ := selfSigned(t)
	for from, to := range map[string]string{renewedCert: certFile, renewedKey: keyFile} {
		b, err := os.ReadFile(from)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(to, b, 0o600))
	}
	second, err := served(&tls.Config{})
	require.NoError(t, err)
	assert.Equal(t, der(renewedCert), second, "the renewed pair is served")

	require.NoError(t, os.WriteFile(certFile, []byte("not a certificate"), 0o600))
	third, err := served(&tls.Config{})
	require.NoError(t, err)
	assert.Equal(t, second, third, "a broken renewal keeps the previous pair")
	assert.Contains(t, logs.String(), "serving the previous pair")
}

// TestAdminTLS: the admin listener speaks HTTPS with its own pair, and
// with --admin-client-ca answers only clients with a certificate that
// authority signed.
func TestAdminTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u, "--admin-tls-cert", certFile, "--admin-tls-key", keyFile, "--admin-client-ca", certFile)
	admin := p.adminURL()
	require.True(t, strings.HasPrefix(admin, "https://"), admin)

	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	// The test's certificate is its own authority, and serves as the
	// client's certificate too.
	withCert := &http.Client{Timeout: guard, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}}
	status, _, body, err := idemtest.Send(t.Context(), withCert, "GET", admin+"/healthz", "")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status, "%s", body)

	without := &http.Client{Timeout: guard, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	_, _, _, err = idemtest.Send(t.Context(), without, "GET", admin+"/healthz", "")
	assert.Error(t, err, "a client without a certificate is refused at the handshake")
}
