package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/idemtest"
)

// upstream is the service behind the proxy, in the test process, so that
// tests can count what really executed. Its paths choose a behaviour:
//
//	/block   waits for release (or its request's end) before answering
//	/hang    never answers; reports on hungUp when the proxy gives up
//	/fail    reads the request and drops the connection unanswered
//	/stream  sends a first part, waits for more, sends the rest
//	/cut     sends a first part and drops the connection
//	/error   answers 500
//	/status  answers the status its X-Status header names, with the
//	         Idempotency-Outcome its X-Outcome names, if any
//	other    answers 201 with what it received
type upstream struct {
	*httptest.Server
	started chan string   // the key of each request, as it arrives
	release chan struct{} // closed to let /block requests answer
	more    chan struct{} // closed to let /stream finish
	hungUp  chan string   // the key of each /hang request the proxy gave up on

	mu      sync.Mutex
	runs    map[string]int         // executions per Authorization + key, guarded by mu
	headers map[string]http.Header // the last request's headers per key, guarded by mu
	n       int                    // executions in all, guarded by mu
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{
		started: make(chan string, 100), release: make(chan struct{}), more: make(chan struct{}), hungUp: make(chan string, 10),
		runs: map[string]int{}, headers: map[string]http.Header{},
	}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.runs[r.Header.Get("Authorization")+" "+key]++
	u.headers[key] = r.Header.Clone()
	u.n++
	run := u.n
	u.mu.Unlock()
	select {
	case u.started <- key:
	default: // nobody is watching
	}
	switch r.URL.Path {
	case "/block":
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
	case "/hang":
		<-r.Context().Done()
		u.hungUp <- key
		return
	case "/fail":
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
		return
	case "/stream":
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "first part\n")
		http.NewResponseController(w).Flush()
		<-u.more
		io.WriteString(w, "second part\n")
		return
	case "/cut":
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "the start of something\n")
		http.NewResponseController(w).Flush()
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
		return
	case "/error":
		http.Error(w, "upstream broke", http.StatusInternalServerError)
		return
	case "/login":
		w.Header().Set("Set-Cookie", fmt.Sprintf("session=s%d", run))
		w.Header().Set("X-Trace", fmt.Sprintf("t%d", run))
		w.WriteHeader(http.StatusCreated)
		return
	case "/status":
		if o := r.Header.Get("X-Outcome"); o != "" {
			w.Header().Set("Idempotency-Outcome", o)
		}
		w.Header().Set("Idempotency-Key-Expires", "the upstream's own")
		code, _ := strconv.Atoi(r.Header.Get("X-Status"))
		w.WriteHeader(code)
		fmt.Fprintf(w, "run %d", run)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/things/%d", run))
	if key != "" {
		w.Header().Set("Idempotency-Key", key) // as many APIs echo it
	}
	w.Header().Add("X-Upstream", "one")
	w.Header().Add("X-Upstream", "two")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"run":%d,"method":%q,"path":%q,"query":%q,"body":%q}`, run, r.Method, r.URL.Path, r.URL.RawQuery, body)
}

// count returns how often the request with auth and key executed.
func (u *upstream) count(auth, key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[auth+" "+key]
}

func (u *upstream) total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n
}

func (u *upstream) header(key string) http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.headers[key]
}

// startProxy starts a proxy in front of u. Its admin listener takes a free
// port, since the default one is shared by every proxy on the machine;
// args may override that.
func startProxy(t *testing.T, u *upstream, args ...string) *daemon {
	t.Helper()
	return startDaemon(t, append([]string{"proxy", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--upstream", u.URL}, args...)...)
}

const auth = "Bearer sk_test_alice"

func keyed(key string) []string { return []string{"Idempotency-Key", key, "Authorization", auth} }

// replayHeader is what must be identical between a response and its
// replay: everything but the date and the replay mark.
func replayHeader(h http.Header) http.Header {
	h = h.Clone()
	h.Del("Date")
	h.Del("Idempotent-Replayed")
	return h
}

// TestProxyContract runs the contract's cases against one proxy and one
// upstream; each case uses its own keys.
func TestProxyContract(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	// --wait: the concurrent-duplicate cases wait for the first request
	// instead of getting 409 at once.
	p := startProxy(t, u, "--wait", "5s", "--max-body", "4096")

	t.Run("first call and replay", func(t *testing.T) {
		key := newKey()
		hdr := append(keyed(key), "Connection", "X-Hop", "X-Hop", "secret", "Keep-Alive", "timeout=5", "X-Forwarded-For", "6.6.6.6")
		body := `{"amount": 4200, "currency": "usd"}`
		first := send(t, "POST", p.url+"/v1/payments?expand=customer", body, hdr...)
		require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
		assert.Empty(t, first.header.Get("Idempotent-Replayed"))
		assert.Equal(t, []string{key}, first.header.Values("Idempotency-Key"), "once, though the upstream echoes it")
		assert.Equal(t, []string{"one", "two"}, first.header.Values("X-Upstream"))

		again := send(t, "POST", p.url+"/v1/payments?expand=customer", body, hdr...)
		assert.Equal(t, http.StatusCreated, again.status)
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, again.body)
		assert.Equal(t, replayHeader(first.header), replayHeader(again.header))
		assert.Equal(t, 1, u.count(auth, key))

		// What the upstream was sent.
		got := u.header(key)
		assert.Equal(t, key, got.Get("Idempotency-Key"), "the key is forwarded")
		assert.Equal(t, auth, got.Get("Authorization"))
		assert.Empty(t, got.Get("X-Hop"), "a field named by Connection is hop-by-hop")
		assert.Empty(t, got.Get("Keep-Alive"))
		assert.Equal(t, "127.0.0.1", got.Get("X-Forwarded-For"), "the client's own X-Forwarded-For is not trusted")
		assert.Equal(t, strings.TrimPrefix(p.url, "http://"), got.Get("X-Forwarded-Host"))
		assert.Equal(t, "http", got.Get("X-Forwarded-Proto"))
		assert.Contains(t, string(first.body), `"query":"expand=customer"`)
	})

	t.Run("same request spelt otherwise replays", func(t *testing.T) {
		key := newKey()
		first := send(t, "POST", p.url+"/v1/payments", `{"amount": 4200, "currency": "usd", "meta": {"a": 1, "b": [1.50]}}`, keyed(key)...)
		require.Equal(t, http.StatusCreated, first.status)
		again := send(t, "POST", p.url+"/v1/payments", `{"meta":{"b":[15e-1],"a":1.0},"currency":"usd","amount":4.2e3}`, keyed(key)...)
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, again.body)
		assert.Equal(t, 1, u.count(auth, key))
	})

	t.Run("changed amount is refused", func(t *testing.T) {
		key := newKey()
		require.Equal(t, http.StatusCreated, send(t, "POST", p.url+"/v1/payments", `{"amount": 4200}`, keyed(key)...).status)
		r := send(t, "POST", p.url+"/v1/payments", `{"amount": 4201}`, keyed(key)...)
		assert.Equal(t, http.StatusUnprocessableEntity, r.status)
		assert.Equal(t, "idempotency_key_reuse", r.code(t))
		assert.Equal(t, 1, u.count(auth, key))
	})

	t.Run("malformed keys reach nothing", func(t *testing.T) {
		cases := []struct {
			name   string
			header []string
			code   string
		}{
			{"missing", []string{"Authorization", auth}, "idempotency_key_missing"},
			{"empty", keyed(""), "idempotency_key_invalid"},
			{"256 characters", keyed(strings.Repeat("k", 256)), "idempotency_key_invalid"},
			{"bad alphabet", keyed("key with spaces!"), "idempotency_key_invalid"},
			{"duplicated", append(keyed("k1"), "Idempotency-Key", "k1"), "idempotency_key_invalid"},
		}
		before := u.total()
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				r := send(t, "POST", p.url+"/v1/payments", `{"amount": 1}`, c.header...)
				assert.Equal(t, http.StatusBadRequest, r.status)
				assert.Equal(t, c.code, r.code(t))
			})
		}
		assert.Equal(t, before, u.total())
		// 255 characters is a key.
		long := strings.Repeat("k", 255)
		assert.Equal(t, http.StatusCreated, send(t, "POST", p.url+"/v1/payments", `{"amount": 1}`, keyed(long)...).status)
	})

	t.Run("no Authorization is no tenant", func(t *testing.T) {
		before := u.total()
		r := send(t, "POST", p.url+"/v1/payments", `{}`, "Idempotency-Key", newKey())
		assert.Equal(t, http.StatusUnauthorized, r.status)
		assert.Equal(t, "tenant_missing", r.code(t))
		assert.Equal(t, before, u.total())
	})

	t.Run("tenants stay apart", func(t *testing.T) {
		key := newKey()
		body := `{"amount": 4200}`
		alice := send(t, "POST", p.url+"/v1/payments", body, keyed(key)...)
		bob := send(t, "POST", p.url+"/v1/payments", body, "Idempotency-Key", key, "Authorization", "Bearer sk_test_bob")
		require.Equal(t, http.StatusCreated, alice.status)
		require.Equal(t, http.StatusCreated, bob.status)
		assert.Empty(t, bob.header.Get("Idempotent-Replayed"))
		assert.NotEqual(t, alice.body, bob.body)
		assert.Equal(t, 1, u.count(auth, key))
		assert.Equal(t, 1, u.count("Bearer sk_test_bob", key))
	})

	t.Run("GET passes through", func(t *testing.T) {
		before := u.total()
		for range 2 {
			r := send(t, "GET", p.url+"/v1/payments/pay_1", "")
			assert.Equal(t, http.StatusCreated, r.status) // whatever the upstream says
			assert.Empty(t, r.header.Get("Idempotent-Replayed"))
		}
		assert.Equal(t, before+2, u.total())
	})

	t.Run("a keyed PATCH runs once though --require leaves it out", func(t *testing.T) {
		key := newKey()
		first := send(t, "PATCH", p.url+"/v1/payments/pay_1", `{"amount": 1}`, keyed(key)...)
		require.Equal(t, http.StatusCreated, first.status)
		again := send(t, "PATCH", p.url+"/v1/payments/pay_1", `{"amount": 1}`, keyed(key)...)
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, again.body)
		assert.Equal(t, 1, u.count(auth, key))
	})

	t.Run("oversized body", func(t *testing.T) {
		before := u.total()
		r := send(t, "POST", p.url+"/v1/payments", `"`+strings.Repeat("x", 4096)+`"`, keyed(newKey())...)
		assert.Equal(t, http.StatusRequestEntityTooLarge, r.status)
		assert.Equal(t, "payload_too_large", r.code(t))
		assert.Equal(t, before, u.total())
	})

	t.Run("upstream errors are outcomes", func(t *testing.T) {
		key := newKey()
		first := send(t, "POST", p.url+"/error", `{}`, keyed(key)...)
		assert.Equal(t, http.StatusInternalServerError, first.status)
		again := send(t, "POST", p.url+"/error", `{}`, keyed(key)...)
		assert.Equal(t, http.StatusInternalServerError, again.status)
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, again.body)
		assert.Equal(t, 1, u.count(auth, key))
	})

	t.Run("upstream dropping the request makes it unknown", func(t *testing.T) {
		for _, body := range []string{`{"amount": 1}`, ""} {
			// A pooled connection first: net/http would resend a
			// request with an Idempotency-Key and no body after a reused
			// connection broke, were the proxy not hiding the key.
			send(t, "GET", p.url+"/warm", "")
			key := newKey()
			r := send(t, "POST", p.url+"/fail", body, keyed(key)...)
			assert.Equal(t, http.StatusBadGateway, r.status)
			assert.Equal(t, "upstream_failed", r.code(t))
			retry := send(t, "POST", p.url+"/fail", body, keyed(key)...)
			assert.Equal(t, http.StatusConflict, retry.status)
			assert.Equal(t, "outcome_pending", retry.code(t))
			assert.Equal(t, 1, u.count(auth, key), "body %q", body)
		}
	})

	t.Run("response cut off midway makes it unknown", func(t *testing.T) {
		key := newKey()
		_, err := trySend(context.Background(), "POST", p.url+"/cut", `{}`, keyed(key)...)
		require.Error(t, err, "the client sees the response break off")
		retry := send(t, "POST", p.url+"/cut", `{}`, keyed(key)...)
		assert.Equal(t, http.StatusConflict, retry.status, "%s", retry.body)
		assert.Equal(t, "outcome_pending", retry.code(t))
		assert.Equal(t, 1, u.count(auth, key))
	})

	t.Run("streamed response", func(t *testing.T) {
		key := newKey()
		req, err := http.NewRequest("POST", p.url+"/stream", strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Authorization", auth)
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		// The first part arrives while the upstream is still waiting to
		// send the second.
		part := make([]byte, len("first part\n"))
		_, err = io.ReadFull(resp.Body, part)
		require.NoError(t, err)
		assert.Equal(t, "first part\n", string(part))
		close(u.more)
		rest, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, "second part\n", string(rest))

		again := send(t, "POST", p.url+"/stream", `{}`, keyed(key)...)
		assert.Equal(t, http.StatusOK, again.status)
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, "first part\nsecond part\n", string(again.body))
		assert.Equal(t, 1, u.count(auth, key))
	})
}

// TestProxyRefusesHTTP2PriorKnowledge: a client that opens with the HTTP/2
// preface reaches net/http as a request "PRI *", which must not be
// forwarded as an HTTP/1.1 request for "/*". The proxy answers 505 and
// closes the connection; the upstream sees nothing.
func TestProxyRefusesHTTP2PriorKnowledge(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u)
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusHTTPVersionNotSupported, resp.StatusCode)
	assert.Equal(t, "http_version_not_supported", reply{resp.StatusCode, resp.Header, body}.code(t))
	assert.True(t, resp.Close, "the connection is not reused")
	assert.Zero(t, u.total(), "the upstream is not touched")
	// The proxy still serves HTTP/1.1.
	assert.Equal(t, http.StatusCreated, send(t, "POST", p.url+"/v1/payments", `{}`, keyed(newKey())...).status)
}

// TestProxyStoredBodyCap: --max-stored-body bounds what is kept for a
// replay. An answer over it reaches the first client whole; a retry is
// told, with a 410 that keeps the original status, that the operation ran
// and its answer cannot be sent again, never handed an empty success.
func TestProxyStoredBodyCap(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u, "--max-stored-body", "1KiB")
	small, big := newKey(), newKey()
	for range 2 {
		send(t, "POST", p.url+"/v1/payments", `{}`, keyed(small)...)
	}
	assert.Equal(t, 1, u.count(auth, small))

	body := `"` + strings.Repeat("x", 1024) + `"`
	first := send(t, "POST", p.url+"/v1/payments", body, keyed(big)...)
	require.Equal(t, http.StatusCreated, first.status)
	require.Greater(t, len(first.body), 1024)
	again := send(t, "POST", p.url+"/v1/payments", body, keyed(big)...)
	assert.Equal(t, http.StatusGone, again.status)
	assert.Equal(t, "response_body_omitted", again.code(t))
	assert.Equal(t, 201.0, decode(t, again.body)["original_status"])
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, u.count(auth, big))
}

// TestProxyConcurrent sends 50 identical requests at once: the upstream
// runs one, and the rest are told it is in progress.
func TestProxyConcurrent(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u)
	key := newKey()
	const n = 50
	replies := make(chan reply, n)
	for range n {
		go func() {
			r, err := trySend(context.Background(), "POST", p.url+"/block", `{"amount": 4200}`, keyed(key)...)
			assert.NoError(t, err)
			replies <- r
		}()
	}
	// The one that got through is held at the upstream until every other
	// has its answer, so all 49 really overlapped it.
	for range n - 1 {
		r := <-replies
		require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
		assert.Equal(t, "request_in_progress", r.code(t))
		assert.NotEmpty(t, r.header.Get("Retry-After"))
	}
	close(u.release)
	assert.Equal(t, http.StatusCreated, (<-replies).status)
	assert.Equal(t, 1, u.count(auth, key))
}

// TestProxyReusesUpstreamConnections: concurrent requests keep their
// connections to the upstream for the next ones, instead of opening one
// per request and leaving sockets in TIME_WAIT.
func TestProxyReusesUpstreamConnections(t *testing.T) {
	u := newUpstream(t)
	var opened atomic.Int32
	u.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	u.Start()
	p := startProxy(t, u)
	const callers, rounds = 8, 5
	for range rounds {
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				r, err := trySend(context.Background(), "POST", p.url+"/pay", `{"amount": 4200}`, keyed(newKey())...)
				assert.NoError(t, err)
				assert.Equal(t, http.StatusCreated, r.status, "%s", r.body)
			})
		}
		wg.Wait()
	}
	assert.LessOrEqual(t, int(opened.Load()), 2*callers, "connections opened to the upstream for %d requests", callers*rounds)
}

// TestProxyLeavesEncodingToClient: a client that asks for no encoding gets
// the upstream's plain answer, stored with its length, and the upstream
// hears no Accept-Encoding the client did not send.
func TestProxyLeavesEncodingToClient(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u)
	plain := &http.Client{Transport: &http.Transport{DisableCompression: true}, Timeout: guard}
	key := newKey()
	status, h, _, err := idemtest.Send(context.Background(), plain, "POST", p.url+"/pay", `{"amount": 4200}`, keyed(key)...)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, status)
	assert.NotEmpty(t, h.Get("Content-Length"))
	assert.Empty(t, u.header(key).Values("Accept-Encoding"))
}

// TestProxyUpstreamDown: a request that never reached the upstream frees
// its key, and the retry once the upstream is back runs it once.
func TestProxyUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // connections to addr are now refused

	u := newUpstream(t)
	base := "https://docs.example.com/idem/"
	p := startDaemon(t, "proxy", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--upstream", "http://"+addr,
		"--problem-base", base)
	key := newKey()
	down := send(t, "POST", p.url+"/v1/payments", `{"amount": 4200}`, keyed(key)...)
	assert.Equal(t, http.StatusBadGateway, down.status)
	assert.Equal(t, "upstream_unavailable", down.code(t))
	assert.Empty(t, down.header.Get("Idempotent-Replayed"))
	// The proxy's own problems and the middleware's are typed under one
	// base, and link to their documentation.
	assert.Equal(t, base+"upstream_unavailable", decode(t, down.body)["type"])
	assert.Equal(t, "<"+base+`upstream_unavailable>; rel="describedby"`, down.header.Get("Link"))
	missing := send(t, "POST", p.url+"/v1/payments", `{}`, "Authorization", auth)
	assert.Equal(t, base+"idempotency_key_missing", decode(t, missing.body)["type"])
	assert.Equal(t, "<"+base+`idempotency_key_missing>; rel="describedby"`, missing.header.Get("Link"))

	ln, err = net.Listen("tcp", addr)
	require.NoError(t, err, "the port was taken in between; rerun")
	u.Listener.Close()
	u.Listener = ln
	u.Start()
	up := send(t, "POST", p.url+"/v1/payments", `{"amount": 4200}`, keyed(key)...)
	assert.Equal(t, http.StatusCreated, up.status, "%s", up.body)
	assert.Empty(t, up.header.Get("Idempotent-Replayed"))
	again := send(t, "POST", p.url+"/v1/payments", `{"amount": 4200}`, keyed(key)...)
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, u.count(auth, key))
}

// TestProxyUpstreamHangs: the client gives up, the proxy gives up on the
// upstream later, and since the upstream may have acted the outcome is
// unknown: the retry is told so, and nothing runs again.
func TestProxyUpstreamHangs(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u, "--lease", "5s", "--upstream-timeout", "300ms", "--wait", "5s")
	key := newKey()
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := trySend(ctx, "POST", p.url+"/hang", `{"amount": 4200}`, keyed(key)...)
		gaveUp <- err
	}()
	assert.Equal(t, key, <-u.started)
	cancel() // the client's timeout
	require.Error(t, <-gaveUp)

	// The retry waits for the first attempt to end (--wait), then hears
	// that its outcome is pending.
	retry := send(t, "POST", p.url+"/hang", `{"amount": 4200}`, keyed(key)...)
	assert.Equal(t, http.StatusConflict, retry.status, "%s", retry.body)
	assert.Equal(t, "outcome_pending", retry.code(t))
	assert.Equal(t, key, <-u.hungUp, "the proxy cancelled the upstream request")
	assert.Equal(t, 1, u.count(auth, key))
}

// TestProxyRestart stops a proxy while a request is in flight, starts
// another on the same data, and finds every outcome where it was left.
func TestProxyRestart(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u)

	done := newKey()
	first := send(t, "POST", p.url+"/v1/payments", `{"amount": 1}`, keyed(done)...)
	require.Equal(t, http.StatusCreated, first.status)
	lost := newKey()
	require.Equal(t, http.StatusBadGateway, send(t, "POST", p.url+"/fail", `{}`, keyed(lost)...).status)

	// SIGTERM while a request is at the upstream: it still completes, is
	// answered and is stored before the process exits.
	inFlight := newKey()
	answered := make(chan reply, 1)
	go func() {
		r, err := trySend(context.Background(), "POST", p.url+"/block", `{"amount": 3}`, keyed(inFlight)...)
		assert.NoError(t, err)
		answered <- r
	}()
	for k := range u.started {
		if k == inFlight {
			break
		}
	}
	p.signal()
	p.waitLine("draining")
	close(u.release)
	drained := <-answered
	assert.Equal(t, http.StatusCreated, drained.status, "%s", drained.body)
	assert.Equal(t, 0, p.wait(), p.stderr.String())
	p.waitLine("stopped")

	again := startDaemon(t, "proxy", "--data", p.data, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--upstream", u.URL)
	r := send(t, "POST", again.url+"/v1/payments", `{"amount": 1}`, keyed(done)...)
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	assert.Equal(t, first.body, r.body)
	assert.Equal(t, replayHeader(first.header), replayHeader(r.header))
	r = send(t, "POST", again.url+"/block", `{"amount": 3}`, keyed(inFlight)...)
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	assert.Equal(t, drained.body, r.body)
	assert.Equal(t, "outcome_pending", send(t, "POST", again.url+"/fail", `{}`, keyed(lost)...).code(t))
	for _, k := range []string{done, lost, inFlight} {
		assert.Equal(t, 1, u.count(auth, k))
	}

	// A second proxy on the same data is turned away.
	second := runIdem(t, "", "proxy", "--data", p.data, "--listen", "127.0.0.1:0", "--upstream", u.URL)
	assert.Equal(t, 1, second.code)
	assert.Contains(t, second.stderr, "another idem process holds it")
	assert.Empty(t, second.stdout)
}

// TestProxyOutcomePolicy: --release-status frees the key, --unknown-status
// leaves it unknown, and any other status is stored and replayed.
func TestProxyOutcomePolicy(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u, "--release-status", "429, 502-503", "--unknown-status", "504")
	status := func(key string, code int) reply {
		return send(t, "POST", p.url+"/status", `{}`, append(keyed(key), "X-Status", strconv.Itoa(code))...)
	}

	key := newKey()
	r := status(key, 503)
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, http.StatusCreated, status(key, 201).status, "a released key runs again")
	assert.Equal(t, 2, u.count(auth, key))

	key = newKey()
	assert.Equal(t, http.StatusGatewayTimeout, status(key, 504).status)
	r = status(key, 201)
	assert.Equal(t, http.StatusConflict, r.status)
	assert.Equal(t, "outcome_pending", r.code(t))

	key = newKey()
	first := status(key, 500)
	r = status(key, 201)
	assert.Equal(t, http.StatusInternalServerError, r.status, "an unlisted status is stored")
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(first.body), string(r.body))
	assert.Equal(t, 1, u.count(auth, key))
}

// TestProxyUpstreamOutcomeHeader: the upstream's Idempotency-Outcome
// overrides the status lists, and no client ever sees it.
func TestProxyUpstreamOutcomeHeader(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u, "--release-status", "503")
	said := func(key string, code int, outcome string) reply {
		r := send(t, "POST", p.url+"/status", `{}`, append(keyed(key), "X-Status", strconv.Itoa(code), "X-Outcome", outcome)...)
		assert.NotContains(t, r.header, "Idempotency-Outcome")
		assert.NotEqual(t, "the upstream's own", r.header.Get("Idempotency-Key-Expires"), "only the proxy says when a key expires")
		return r
	}

	key := newKey()
	assert.Equal(t, http.StatusCreated, said(key, 201, "release").status)
	assert.Empty(t, said(key, 201, "").header.Get("Idempotent-Replayed"), "released: the retry runs")
	assert.Equal(t, 2, u.count(auth, key))

	key = newKey()
	said(key, 201, "Unknown")
	assert.Equal(t, "outcome_pending", said(key, 201, "").code(t))

	key = newKey()
	said(key, 503, "store")
	r := said(key, 201, "")
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "store wins over --release-status")
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))

	key = newKey()
	said(key, 201, "later")
	assert.Equal(t, "true", said(key, 201, "").header.Get("Idempotent-Replayed"), "a value the proxy does not know changes nothing")

	r = send(t, "GET", p.url+"/status", "", "X-Status", "200", "X-Outcome", "release")
	assert.Equal(t, http.StatusOK, r.status)
	assert.NotContains(t, r.header, "Idempotency-Outcome", "stripped from an unrecorded answer too")
	assert.NotContains(t, r.header, "Idempotency-Key-Expires")

	require.Equal(t, 0, p.stop())
	assert.Contains(t, p.stderr.String(), "is not release, unknown or store; ignored")
}

func TestProxyTenantFrom(t *testing.T) {
	u := newUpstream(t)
	u.Start()

	byHeader := startProxy(t, u, "--tenant-from", "header:X-Account")
	key := newKey()
	r := send(t, "POST", byHeader.url+"/v1/payments", `{}`, "Idempotency-Key", key, "Authorization", auth)
	assert.Equal(t, http.StatusUnauthorized, r.status)
	assert.Equal(t, "tenant_missing", r.code(t))
	for _, account := range []string{"acct_1", "acct_2"} {
		r = send(t, "POST", byHeader.url+"/v1/payments", `{}`, "Idempotency-Key", key, "X-Account", account)
		assert.Equal(t, http.StatusCreated, r.status)
		assert.Empty(t, r.header.Get("Idempotent-Replayed"), account)
	}
	assert.Equal(t, 2, u.count("", key))

	none := startProxy(t, u, "--tenant-from", "none", "--require", "post, patch")
	key = newKey()
	for _, method := range []string{"PATCH", "PATCH"} {
		r = send(t, method, none.url+"/v1/payments/1", `{}`, "Idempotency-Key", key)
		assert.Equal(t, http.StatusCreated, r.status)
	}
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, u.count("", key))
	assert.Equal(t, "idempotency_key_missing", send(t, "PATCH", none.url+"/v1/payments/1", `{}`).code(t))

	// Standard error is read in full once the process has exited.
	require.Equal(t, 0, none.stop())
	assert.Contains(t, none.stderr.String(), "--tenant-from none: all callers share one key space and each other's stored responses")
	require.Equal(t, 0, byHeader.stop())
	assert.NotContains(t, byHeader.stderr.String(), "share")
}

// TestProxyUnstoredHeaders: the first caller gets the upstream's cookie, a
// replay does not, and --unstored-headers changes which fields stay out.
func TestProxyUnstoredHeaders(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	for _, c := range []struct {
		name          string
		args          []string
		cookie, trace bool // replayed
	}{
		{"default", nil, false, true},
		{"chosen", []string{"--unstored-headers", "x-trace"}, true, false},
		{"none", []string{"--unstored-headers", ""}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startProxy(t, u, c.args...)
			key := newKey()
			first := send(t, "POST", p.url+"/login", `{}`, keyed(key)...)
			require.Equal(t, http.StatusCreated, first.status)
			require.NotEmpty(t, first.header.Get("Set-Cookie"))
			require.NotEmpty(t, first.header.Get("X-Trace"))
			r := send(t, "POST", p.url+"/login", `{}`, keyed(key)...)
			require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
			assert.Equal(t, c.cookie, r.header.Get("Set-Cookie") != "", "Set-Cookie replayed")
			assert.Equal(t, c.trace, r.header.Get("X-Trace") != "", "X-Trace replayed")
			assert.Equal(t, 1, u.count(auth, key))
		})
	}
}

// TestProxyClaimRate: over --claim-rate a new key gets 429 and reaches no
// upstream, while a retry of a stored key replays and another tenant goes
// on; a route's claim_rate gives it buckets of its own.
func TestProxyClaimRate(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u, "--claim-rate", "0.001", "--claim-burst", "2",
		"--routes", writeRoutes(t, `{"POST /v1/refunds": {"claim_rate": 0.001, "claim_burst": 1}}`))
	first, second := newKey(), newKey()
	require.Equal(t, http.StatusCreated, send(t, "POST", p.url+"/v1/payments", `{}`, keyed(first)...).status)
	require.Equal(t, http.StatusCreated, send(t, "POST", p.url+"/v1/payments", `{}`, keyed(second)...).status)

	third := newKey()
	r := send(t, "POST", p.url+"/v1/payments", `{}`, keyed(third)...)
	assert.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "rate_limited", r.code(t))
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	assert.Zero(t, u.count(auth, third))

	replay := send(t, "POST", p.url+"/v1/payments", `{}`, keyed(first)...)
	assert.Equal(t, http.StatusCreated, replay.status)
	assert.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	assert.Equal(t, http.StatusUnprocessableEntity, send(t, "POST", p.url+"/v1/payments", `{"other":1}`, keyed(first)...).status)

	other := send(t, "POST", p.url+"/v1/payments", `{}`, "Idempotency-Key", third, "Authorization", "Bearer sk_test_bob")
	assert.Equal(t, http.StatusCreated, other.status, "another tenant is not slowed")

	refund := newKey()
	assert.Equal(t, http.StatusCreated, send(t, "POST", p.url+"/v1/refunds", `{}`, keyed(refund)...).status, "the route has its own bucket")
	assert.Equal(t, http.StatusTooManyRequests, send(t, "POST", p.url+"/v1/refunds", `{}`, keyed(newKey())...).status)
	assert.Equal(t, 1, u.count(auth, first))
}

// TestProxyStoreFull: over --max-store-size a new key gets 507 and reaches
// no upstream, and a key stored before still replays.
func TestProxyStoreFull(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	dir := t.TempDir()
	key := newKey()
	p := startProxy(t, u, "--data", dir)
	first := send(t, "POST", p.url+"/v1/payments", `{}`, keyed(key)...)
	require.Equal(t, http.StatusCreated, first.status)
	require.Zero(t, p.stop())

	p = startProxy(t, u, "--data", dir, "--max-store-size", "1")
	fresh := newKey()
	r := send(t, "POST", p.url+"/v1/payments", `{}`, keyed(fresh)...)
	assert.Equal(t, http.StatusInsufficientStorage, r.status)
	assert.Equal(t, "store_full", r.code(t))
	assert.Equal(t, "30", r.header.Get("Retry-After"))
	assert.Zero(t, u.count(auth, fresh))
	replay := send(t, "POST", p.url+"/v1/payments", `{}`, keyed(key)...)
	assert.Equal(t, http.StatusCreated, replay.status)
	assert.Equal(t, string(first.body), string(replay.body))
	assert.Equal(t, 1, u.count(auth, key))

	bad := runIdem(t, "", "proxy", "--upstream", u.URL, "--data", t.TempDir(), "--claim-burst", "3")
	assert.Equal(t, 2, bad.code)
	assert.Contains(t, bad.stderr, "--claim-burst needs --claim-rate")
	bad = runIdem(t, "", "proxy", "--upstream", u.URL, "--data", t.TempDir(), "--routes", writeRoutes(t, `{"POST /x": {"claim_rate": -1}}`))
	assert.Equal(t, 2, bad.code)
	assert.Contains(t, bad.stderr, "claim_rate -1 must be a positive number")
}

func TestProxyUsage(t *testing.T) {
	cases := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"no upstream", nil, "--upstream is required"},
		{"upstream not a URL", []string{"--upstream", "localhost:3000"}, "must be an http:// or https:// URL"},
		{"tenant source", []string{"--upstream", "http://x", "--tenant-from", "cookie"}, "want auth, header:NAME or none"},
		{"empty header name", []string{"--upstream", "http://x", "--tenant-from", "header:"}, "header name is missing"},
		{"ttl too short", []string{"--upstream", "http://x", "--ttl", "1m"}, "TTL 1m0s must be at least 10 leases"},
		{"negative lease", []string{"--upstream", "http://x", "--lease", "-1s"}, "Lease -1s must be positive"},
		{"timeout past the lease", []string{"--upstream", "http://x", "--upstream-timeout", "30s"}, "shorter than the lease"},
		{"no drain", []string{"--upstream", "http://x", "--drain", "0s"}, "--drain 0s must be positive"},
		{"no methods", []string{"--upstream", "http://x", "--require", ","}, "names no method"},
		{"negative wait", []string{"--upstream", "http://x", "--wait", "-1s"}, "Options.Wait"},
		{"no stored body", []string{"--upstream", "http://x", "--max-stored-body", "0"}, "--max-stored-body 0 must be positive"},
		{"stored body unit", []string{"--upstream", "http://x", "--max-stored-body", "4XB"}, "want a number of bytes"},
		{"relative problem base", []string{"--upstream", "http://x", "--problem-base", "errors/"}, "Options.ProblemBase"},
		{"status list", []string{"--upstream", "http://x", "--release-status", "429,5x"}, `--release-status: "5x" is not a status`},
		{"status range", []string{"--upstream", "http://x", "--unknown-status", "504-500"}, `--unknown-status: "504-500" is not`},
		{"status twice", []string{"--upstream", "http://x", "--release-status", "503", "--unknown-status", "5xx"}, "status 503 is in both"},
		{"unknown flag", []string{"--upstream", "http://x", "--port", "1"}, "flag provided but not defined"},
		{"argument", []string{"--upstream", "http://x", "extra"}, `unexpected argument "extra"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runIdem(t, "", append([]string{"proxy", "--data", t.TempDir()}, c.args...)...)
			assert.Equal(t, 2, r.code)
			assert.Contains(t, r.stderr, c.stderr)
			assert.Contains(t, r.stderr, "usage: idem proxy")
			assert.Empty(t, r.stdout)
		})
	}
}

// TestInMemoryBody: only a body the middleware has read whole is handed to
// the Transport unwrapped; a body still arriving from the client is not.
func TestInMemoryBody(t *testing.T) {
	cases := []struct {
		name string
		body io.ReadCloser
		want bool
	}{
		{"bytes.Reader", io.NopCloser(bytes.NewReader([]byte("{}"))), true},
		{"strings.Reader", io.NopCloser(strings.NewReader("{}")), true},
		{"bytes.Buffer", io.NopCloser(bytes.NewBufferString("{}")), true},
		{"other reader", io.NopCloser(io.LimitReader(strings.NewReader("{}"), 2)), false},
		{"connection", io.NopCloser(&net.TCPConn{}), false},
		{"not a NopCloser", http.NoBody, false},
		{"none", nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, inMemoryBody(c.body))
		})
	}
}
