package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/pebblestore"
)

type reply struct {
	status int
	header http.Header
	body   []byte
}

// code is the problem code of a refusal.
func (r reply) code(t *testing.T) string {
	t.Helper()
	var p struct{ Code string }
	require.NoError(t, json.Unmarshal(r.body, &p), "%s", r.body)
	return p.Code
}

func send(t *testing.T, method, url, body string, header ...string) reply {
	t.Helper()
	status, h, b, err := idemtest.Send(t.Context(), http.DefaultClient, method, url, body, header...)
	require.NoError(t, err)
	return reply{status, h, b}
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m), "%s", b)
	return m
}

// start serves the API on the embedded store in dir until the test ends
// or the returned stop is called.
func start(t *testing.T, dir string, p *provider) (url string, stop func()) {
	t.Helper()
	store, err := pebblestore.Open(dir, nil)
	require.NoError(t, err)
	h, err := newHandler(store, p, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	done := false
	stop = func() {
		if !done {
			done = true
			srv.Close()
			assert.NoError(t, store.Close())
		}
	}
	t.Cleanup(stop)
	return srv.URL, stop
}

func TestWalkthrough(t *testing.T) {
	dir := t.TempDir()
	url, stop := start(t, dir, &provider{})
	alice := []string{"Authorization", "Bearer sk_test_alice"}
	with := func(key string) []string { return append([]string{"Idempotency-Key", key}, alice...) }
	payments := url + "/v1/payments"

	k1 := rand.Text()
	first := send(t, "POST", payments, `{"amount": 4200, "currency": "usd", "customer": "cus_1"}`, with(k1)...)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	assert.Empty(t, first.header.Get("Idempotent-Replayed"))
	id, _ := decode(t, first.body)["id"].(string)
	assert.True(t, strings.HasPrefix(id, "pay_"), id)
	assert.Equal(t, "/v1/payments/"+id, first.header.Get("Location"))

	// Replay, with the members reordered and the amount spelt otherwise.
	again := send(t, "POST", payments, `{"customer":"cus_1","currency":"usd","amount":4.2e3}`, with(k1)...)
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(first.body), string(again.body))
	assert.Equal(t, first.header.Get("Location"), again.header.Get("Location"))

	reuse := send(t, "POST", payments, `{"amount": 5000, "currency": "usd", "customer": "cus_1"}`, with(k1)...)
	assert.Equal(t, http.StatusUnprocessableEntity, reuse.status)
	assert.Equal(t, "idempotency_key_reuse", reuse.code(t))

	// The payment is its account's alone, and another account's request
	// under the same key is an operation of its own.
	got := send(t, "GET", payments+"/"+id, "", alice...)
	require.Equal(t, http.StatusOK, got.status, "%s", got.body)
	assert.Equal(t, "payment_not_found", send(t, "GET", payments+"/"+id, "", "Authorization", "Bearer sk_test_bob").code(t))
	assert.Equal(t, "tenant_missing", send(t, "GET", payments+"/"+id, "").code(t))
	bob := send(t, "POST", payments, `{"amount": 4200, "currency": "usd", "customer": "cus_1"}`, "Idempotency-Key", k1, "Authorization", "Bearer sk_test_bob")
	require.Equal(t, http.StatusCreated, bob.status)
	assert.NotEqual(t, id, decode(t, bob.body)["id"])

	k2 := rand.Text()
	refund := send(t, "POST", url+"/v1/refunds", `{"payment": "`+id+`", "amount": 1000}`, with(k2)...)
	require.Equal(t, http.StatusCreated, refund.status, "%s", refund.body)
	refundAgain := send(t, "POST", url+"/v1/refunds", `{"amount": 1000, "payment": "`+id+`"}`, with(k2)...)
	assert.Equal(t, "true", refundAgain.header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(refund.body), string(refundAgain.body))
	assert.EqualValues(t, 1000, decode(t, send(t, "GET", payments+"/"+id, "", alice...).body)["amount_refunded"])

	// Refusals that committed nothing free the key: the fixed request runs
	// under the same key.
	k3 := rand.Text()
	for range 2 {
		assert.Equal(t, "payment_not_found", send(t, "POST", url+"/v1/refunds", `{"payment": "pay_nope"}`, with(k3)...).code(t))
	}
	rest := send(t, "POST", url+"/v1/refunds", `{"payment": "`+id+`"}`, with(k3)...)
	require.Equal(t, http.StatusCreated, rest.status, "%s", rest.body)
	assert.EqualValues(t, 3200, decode(t, rest.body)["amount"])
	k4 := rand.Text()
	for _, body := range []string{`{"amount": -1, "currency": "usd", "customer": "cus_1"}`, `{"amount": 1, "currency": "USD", "customer": "cus_1"}`,
		`{"amount": 10.5, "currency": "usd", "customer": "cus_1"}`, `{"amount": 1, "currency": "usd"}`, `{"amount": 1, "currency": "usd", "customer": "c", "ammount": 2}`} {
		assert.Equal(t, "invalid_request", send(t, "POST", payments, body, with(k4)...).code(t), body)
	}
	assert.Equal(t, http.StatusCreated, send(t, "POST", payments, `{"amount": 1, "currency": "usd", "customer": "cus_1"}`, with(k4)...).status)

	assert.Equal(t, "idempotency_key_missing", send(t, "POST", payments, `{}`, alice...).code(t))
	assert.Equal(t, "tenant_missing", send(t, "POST", payments, `{}`, "Idempotency-Key", rand.Text()).code(t))

	// The records outlive the process; the in-memory payments do not.
	stop()
	url, _ = start(t, dir, &provider{})
	after := send(t, "POST", url+"/v1/payments", `{"amount": 4200, "currency": "usd", "customer": "cus_1"}`, with(k1)...)
	assert.Equal(t, "true", after.header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(first.body), string(after.body))
	assert.Equal(t, http.StatusNotFound, send(t, "GET", url+"/v1/payments/"+id, "", alice...).status)
}

// TestInProgress: a retry that arrives while the first attempt is at the
// provider is told to come back, and coming back replays that attempt.
func TestInProgress(t *testing.T) {
	p := &provider{entered: make(chan struct{}), gate: make(chan struct{})}
	url, _ := start(t, t.TempDir(), p)
	body := `{"amount": 4200, "currency": "usd", "customer": "cus_1"}`
	hdr := []string{"Idempotency-Key", rand.Text(), "Authorization", "Bearer sk_test_alice"}
	first := make(chan reply, 1)
	go func() { first <- send(t, "POST", url+"/v1/payments", body, hdr...) }()
	<-p.entered
	busy := send(t, "POST", url+"/v1/payments", body, hdr...)
	assert.Equal(t, "request_in_progress", busy.code(t))
	assert.NotEmpty(t, busy.header.Get("Retry-After"))
	p.gate <- struct{}{}
	created := <-first
	require.Equal(t, http.StatusCreated, created.status, "%s", created.body)
	retry := send(t, "POST", url+"/v1/payments", body, hdr...)
	assert.Equal(t, "true", retry.header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(created.body), string(retry.body))
}

// TestTokensStayOutOfTheStore: the account is a digest of the token, so
// the credential is in neither the records nor the logs.
func TestTokensStayOutOfTheStore(t *testing.T) {
	dir := t.TempDir()
	url, stop := start(t, dir, &provider{})
	const token = "sk_live_secret_token"
	r := send(t, "POST", url+"/v1/payments", `{"amount": 1, "currency": "usd", "customer": "c"}`, "Idempotency-Key", rand.Text(), "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusCreated, r.status)
	stop()
	store, err := pebblestore.Open(dir, nil)
	require.NoError(t, err)
	defer store.Close()
	n := 0
	for rec, err := range store.Records(context.Background(), idem.Filter{}) {
		require.NoError(t, err)
		n++
		assert.NotContains(t, rec.Scope.Tenant, token)
		assert.True(t, strings.HasPrefix(rec.Scope.Tenant, "acct_"), rec.Scope.Tenant)
	}
	assert.Equal(t, 1, n)
}

func TestRun(t *testing.T) {
	var stderr strings.Builder
	assert.Equal(t, 2, run(context.Background(), []string{"--provider-delay", "-1s"}, io.Discard, &stderr))
	assert.Equal(t, 2, run(context.Background(), []string{"now"}, io.Discard, &stderr))
	assert.Equal(t, 2, run(context.Background(), []string{"--port", "80"}, io.Discard, &stderr))

	ctx, cancel := context.WithCancel(context.Background())
	out, w := io.Pipe()
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"--data", t.TempDir(), "--addr", "127.0.0.1:0"}, w, &stderr)
		w.Close()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	url := strings.Fields(strings.TrimPrefix(line, "payments: listening on "))[0]
	url = strings.TrimSuffix(url, ",")
	r := send(t, "POST", url+"/v1/payments", `{"amount": 1, "currency": "usd", "customer": "c"}`, "Idempotency-Key", rand.Text(), "Authorization", "Bearer t")
	assert.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	cancel()
	go io.Copy(io.Discard, out)
	assert.Equal(t, 0, <-code)
}

// TestReadsKeepNoState: a GET under a token nobody created a payment with
// leaves nothing behind, so a caller cycling tokens cannot grow memory.
func TestReadsKeepNoState(t *testing.T) {
	a := &api{provider: &provider{}, accounts: map[string]map[string]*payment{}}
	for range 50 {
		r := httptest.NewRequest("GET", "/v1/payments/pay_x", nil)
		r.SetPathValue("id", "pay_x")
		r.Header.Set("Authorization", "Bearer "+rand.Text())
		w := httptest.NewRecorder()
		a.getPayment(w, r)
		require.Equal(t, http.StatusNotFound, w.Code)
	}
	assert.Empty(t, a.accounts)
}
