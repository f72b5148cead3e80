package reliability_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/internal/crashtest"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/pebblestore"
)

// hostile is one input the middleware must refuse with a documented 4xx
// without running anything or storing anything.
type hostile struct {
	class  string
	body   string
	header []string // name, value pairs replacing the defaults of that name
	status int
	code   string // the problem's code; "" when net/http refuses it first
}

// malformedJSON is the JSONTestSuite's n_ classes, one or more documents
// each: everything RFC 8259 forbids, plus what idem forbids on top
// (duplicate members, lone surrogates, a BOM).
var malformedJSON = []string{
	// arrays
	`[1 true]`, `[a]`, `[,1]`, `[1,,2]`, `[1,]`, `[,]`, `["": 1]`, `[1:2]`, `["x"`, `[-]`, `[`, `]`, `[1,`, `[[]`, `[""],`,
	`[` + "\x00" + `]`, `[*]`, `["a",\n4\n,1,`, `[1}`, `[{]`, `["\x"]`, `[nul]`, `[True]`, `[NULL]`, `[tru]`, `[fals]`,
	// objects
	`{`, `}`, `{"a"}`, `{"a":}`, `{"a" 1}`, `{:1}`, `{1:1}`, `{null:null}`, `{"a":1,}`, `{,}`, `{"a":1,,"b":2}`,
	`{'a':1}`, `{a:1}`, `{"a":1}}`, `{"a":1]`, `{"a":"b"#}`, `{"a":/*c*/1}`, `{"a":1 "b":2}`, `{"a"::1}`, `{"\u0000":1`,
	`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"x":{"a":1,"a":1}}`,
	// numbers
	`[01]`, `[-01]`, `[+1]`, `[1.]`, `[.1]`, `[1.e1]`, `[1e]`, `[1e+]`, `[1E-]`, `[0x1]`, `[0X1F]`, `[NaN]`, `[-NaN]`,
	`[Infinity]`, `[-Infinity]`, `[1_000]`, `[1,0e]`, `[--1]`, `[- 1]`, `[1.0.0]`, `[1e1e1]`, `[Inf]`, `[.]`, `[0.e1]`,
	`[1ee2]`, `[2.e-3]`, `[-.5]`, `[\u0031]`, `[１]`,
	// strings
	`["abc`, `["\uD800"]`, `["\uDC00"]`, `["\uD800\u0041"]`, `["\uDBFF\uDBFF"]`, `["\u00"]`, `["\u00G0"]`, `["\a"]`,
	`["\'"]`, `["\`, `["a` + "\t" + `b"]`, `["a` + "\n" + `b"]`, `["` + "\x01" + `"]`, `['single']`, `[abc]`, `["\U0041"]`,
	// structure
	` `, "\r\n", `1 2`, `{} {}`, `[] []`, `"a" "b"`, `nul`, `truefalse`, `{"a":1}x`, `[1]]`, "\ufeff{}", `/* c */ {}`,
	`<?xml version="1.0"?>`, `[` + strings.Repeat(" ", 10) + `,`,
}

// invalidUTF8 are byte sequences that are not UTF-8, placed where JSON has
// text: in values, in member names, outside strings.
var invalidUTF8 = []string{"\xff", "\xfe", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xed\xbf\xbf", "\xf4\x90\x80\x80",
	"\xf8\x88\x80\x80\x80", "\xe2\x82", "\xc3", "\x80", "a\xbfb"}

func hostileInputs() []hostile {
	var in []hostile
	bad := func(class, body string) {
		in = append(in, hostile{class: class, body: body, status: 400, code: idem.CodeBodyInvalid})
	}
	for _, d := range malformedJSON {
		bad("malformed JSON", d)
	}
	// Every prefix and every one-byte corruption of valid documents that
	// encoding/json also calls invalid (idem is stricter, never looser).
	valid := []string{
		`{"amount":4200,"currency":"usd","items":[{"sku":"a-1","qty":2,"price":1.5e2}],"meta":{"note":"caf\u00e9 \"x\"","ok":true,"none":null}}`,
		`[-0.5e-3,123456789012345678,"\ud83d\ude00",{"":[]},false]`,
	}
	corruptions := []byte{'"', '{', '}', '[', ']', ',', ':', '\\', 'x', '0', '-', ' ', 0, 0x7f, 0xff}
	for _, v := range valid {
		for i := range len(v) {
			// An empty body is no body, which a POST may have.
			if i > 0 && !json.Valid([]byte(v[:i])) {
				bad("truncated JSON", v[:i])
			}
			for _, c := range corruptions {
				b := []byte(v)
				b[i] = c
				if !json.Valid(b) {
					bad("corrupted JSON", string(b))
				}
			}
		}
	}
	const deep = 100_000
	bad("deep nesting", strings.Repeat("[", deep)+strings.Repeat("]", deep))
	bad("deep nesting", strings.Repeat(`{"a":`, deep)+"1"+strings.Repeat("}", deep))
	bad("deep nesting", strings.Repeat("[", deep))
	bad("deep nesting", strings.Repeat(`[{"a":`, deep/2))
	bad("deep nesting", `{"x":`+strings.Repeat("[", 129)+strings.Repeat("]", 129)+`}`)
	for _, n := range []string{"1e400", "-1e400", "1e-400", "1e99999999999999999999", "-1E+9223372036854775808",
		"1" + strings.Repeat("0", 400_000), "0." + strings.Repeat("0", 400_000) + "1", strings.Repeat("9", 310),
		"1" + strings.Repeat("0", 310) + ".5e-1", "0.1e-99999999999999999999999"} {
		bad("huge number", `{"amount":`+n+`}`)
	}
	for _, b := range invalidUTF8 {
		bad("invalid UTF-8", `{"name":"`+b+`"}`)
		bad("invalid UTF-8", `{"`+b+`":1}`)
		bad("invalid UTF-8", `[1,`+b+`]`)
	}
	for _, s := range []string{`\ud800`, `\udfff`, `\ud800\ud800`, `\udc00\ud800`, `\ud800x`} {
		bad("lone surrogate", `{"name":"`+s+`"}`)
	}

	key := func(class, value, code string) {
		in = append(in, hostile{class: class, body: `{}`, header: []string{"Idempotency-Key", value}, status: 400, code: code})
	}
	for _, v := range []string{"", " ", "\t", `""`, `" "`, strings.Repeat("k", 256), `"` + strings.Repeat("k", 256) + `"`,
		"key!", "a b", "a,b", "a;b", "ключ", "k\x00", "k\x7f", "k\x80", "k\xff", "a\tb", `"abc`, `abc"`, `"a\b"`, `"a"b"`,
		`"a\"`, `"\`, `"` + "\x01" + `"`, "a/b", "a.b", "a:b", "(a)", "a=", "*", "a\\b", `"a" "b"`} {
		key("bad key", v, idem.CodeKeyInvalid)
	}
	in = append(in,
		hostile{class: "bad key", body: `{}`, header: []string{"Idempotency-Key", "DROP", "Idempotency-Key", "k1", "Idempotency-Key", "k1"}, status: 400, code: idem.CodeKeyInvalid},
		hostile{class: "bad key", body: `{}`, header: []string{"Idempotency-Key", "DROP"}, status: 400, code: idem.CodeKeyMissing},
		hostile{class: "bad tenant", body: `{}`, header: []string{crashtest.TenantHeader, "DROP"}, status: 401, code: idem.CodeTenantMissing},
		hostile{class: "bad tenant", body: `{}`, header: []string{crashtest.TenantHeader, "   "}, status: 401, code: idem.CodeTenantMissing},
		hostile{class: "bad tenant", body: `{}`, header: []string{crashtest.TenantHeader, "t1", crashtest.TenantHeader, "t1"}, status: 401, code: idem.CodeTenantMissing},
		hostile{class: "bad tenant", body: `{}`, header: []string{crashtest.TenantHeader, strings.Repeat("t", 256)}, status: 401, code: idem.CodeTenantMissing},
		hostile{class: "oversized body", body: `"` + strings.Repeat("x", 1<<20) + `"`, status: 413, code: idem.CodePayloadTooLarge},
		hostile{class: "oversized body", body: strings.Repeat("[", 3<<20), status: 413, code: idem.CodePayloadTooLarge},
	)
	return in
}

// tenantFromHeader is the proxy's --tenant-from header:X-Tenant, for the
// in-process middleware, which refuses an over-long tenant itself.
func tenantFromHeader(r *http.Request) (string, error) {
	vs := r.Header.Values(crashtest.TenantHeader)
	if len(vs) != 1 || strings.TrimSpace(vs[0]) == "" {
		return "", errors.New("one X-Tenant header is required")
	}
	return vs[0], nil
}

// buildRequest sets the defaults (a fresh key, a tenant, JSON) and then
// h's header pairs, where the value DROP removes the field.
func applyHeaders(set func(name, value string), del func(name string), add func(name, value string), key string, h hostile) {
	set("Content-Type", "application/json")
	set("Idempotency-Key", key)
	set(crashtest.TenantHeader, "tenant-h")
	replaced := map[string]bool{}
	for i := 0; i+1 < len(h.header); i += 2 {
		name, value := h.header[i], h.header[i+1]
		if !replaced[name] {
			del(name)
			replaced[name] = true
		}
		if value != "DROP" {
			add(name, value)
		}
	}
}

// TestHostileInputMiddleware sends every hostile input through the
// middleware in process: each gets its documented status and code, the
// handler never runs and nothing is stored.
func TestHostileInputMiddleware(t *testing.T) {
	db, _ := idemtest.Open(t, &pebblestore.Options{Logger: quietLogger()})
	ran := 0
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: tenantFromHeader, Logger: quietLogger()})
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		w.WriteHeader(http.StatusCreated)
	}))
	inputs := hostileInputs()
	classes := map[string]int{}
	for i, in := range inputs {
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(in.body))
		applyHeaders(req.Header.Set, req.Header.Del, req.Header.Add, fmt.Sprint("hostile-", i), in)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		classes[in.class]++
		if !assert.Equal(t, in.status, w.Code, "%s %d: %.80q -> %s", in.class, i, in.body, w.Body) {
			continue
		}
		var p idemhttp.Problem
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
		assert.Equal(t, in.code, p.Code, "%s %d: %.80q", in.class, i, in.body)
	}
	// A body that breaks off, and one that trickles past the server's
	// read timeout.
	req := httptest.NewRequest("POST", "/v1/payments", io.MultiReader(strings.NewReader(`{"a":`), errReader{}))
	applyHeaders(req.Header.Set, req.Header.Del, req.Header.Add, "broken-body", hostile{})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	assert.Equal(t, http.StatusBadRequest, w.Code)
	classes["broken body"]++

	assert.Zero(t, ran, "no hostile request may reach the handler")
	n := 0
	for _, err := range db.Records(context.Background(), idem.Filter{Expired: true}) {
		require.NoError(t, err)
		n++
	}
	assert.Zero(t, n, "no hostile request may store anything")
	t.Logf("hostile inputs through the middleware: %d, by class %v; executed 0, stored 0", len(inputs)+1, classes)
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset by peer") }

// TestSlowClientsInProcess puts the middleware behind a server with short
// read timeouts: a client that trickles its headers or its body is cut
// off, and nothing is stored or run.
func TestSlowClientsInProcess(t *testing.T) {
	db, _ := idemtest.Open(t, &pebblestore.Options{Logger: quietLogger()})
	ran := 0
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: tenantFromHeader, Logger: quietLogger()})
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++ })))
	srv.Config.ReadHeaderTimeout = 200 * time.Millisecond
	srv.Config.ReadTimeout = 400 * time.Millisecond
	srv.Start()
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	head := "POST /v1/payments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Tenant: t\r\nIdempotency-Key: slow\r\n"
	// Headers one byte at a time, never finished: the server hangs up.
	assert.True(t, hangsUp(t, addr, head, 20*time.Millisecond), "slow headers")
	// Headers at once, then a body that stops halfway.
	assert.True(t, hangsUp(t, addr, head+"Content-Length: 100\r\n\r\n{\"amount\":", 0), "slow body")
	assert.Zero(t, ran)
	_, err = db.Get(context.Background(), idem.Scope{Tenant: "t", Endpoint: "POST /v1/payments", Key: "slow"})
	assert.ErrorIs(t, err, idem.ErrNotFound)
}

// hangsUp writes msg to a new connection (a byte at a time every pace, or
// at once when pace is 0), then keeps the connection open, and reports
// whether the server ended it, reading whatever answer it sent. A server
// that never does fails the test at the guard.
func hangsUp(t *testing.T, addr, msg string, pace time.Duration) bool {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		io.Copy(io.Discard, c)
	}()
	if pace == 0 {
		c.Write([]byte(msg))
	} else {
		for i := 0; i < len(msg); i++ {
			if _, err := c.Write([]byte{msg[i]}); err != nil {
				break // cut off
			}
			select {
			case <-closed:
				return true
			case <-time.After(pace):
			}
		}
	}
	select {
	case <-closed:
		return true
	case <-time.After(guard):
		return false
	}
}

// TestHostileBodiesRawProxy sends the bodies the canonicalizer refuses,
// all but the thousands of truncations and corruptions, through a proxy
// that hashes them as raw bytes, as it does by default: twice each under
// one key. The upstream gets each once, and the retry is its replay.
func TestHostileBodiesRawProxy(t *testing.T) {
	up := startUpstream(t, 0)
	proxy, url := startProxy(t, proxyArgs(t.TempDir(), "127.0.0.1:0", up.url))
	client := newClient()
	sent := 0
	for i, in := range hostileInputs() {
		if in.code != idem.CodeBodyInvalid || in.class == "truncated JSON" || in.class == "corrupted JSON" {
			continue
		}
		header := []string{"Idempotency-Key", fmt.Sprint("raw-", i), crashtest.TenantHeader, "t"}
		first, err := do(context.Background(), client, "POST", url+chargePath, in.body, header...)
		require.NoError(t, err)
		retry, err := do(context.Background(), client, "POST", url+chargePath, in.body, header...)
		require.NoError(t, err)
		assert.NotEqual(t, idem.CodeBodyInvalid, first.code(), "%s %d", in.class, i)
		assert.True(t, retry.replayed(), "%s %d: %.80q", in.class, i, in.body)
		assert.Equal(t, first.comparable(), retry.comparable(), "%s %d", in.class, i)
		sent++
	}
	assert.Equal(t, sent, up.executions(t), "each body runs once")
	require.NoError(t, proxy.Signal(syscallTERM()))
	code, err := proxy.Wait(guard)
	require.NoError(t, err)
	require.Equal(t, 0, code, proxy.Stderr())
	t.Logf("bodies hashed raw through the proxy: %d, each run once", sent)
}

// TestHostileInputProxy sends the hostile inputs through a real idem
// proxy with --strict-canonical, plus what only a raw connection can send
// (broken framing, oversized headers, control bytes, a slow-loris client).
// The upstream journal must stay empty but for the control requests, and
// the store must hold only theirs. It runs once on each store: a proxy
// with --data, and a replica with --store on PostgreSQL.
func TestHostileInputProxy(t *testing.T) {
	for _, ps := range proxyStores {
		t.Run("store="+ps.name, func(t *testing.T) { hostileInputProxy(t, ps.new(t)) })
	}
}

func hostileInputProxy(t *testing.T, store proxyStore) {
	up := startUpstream(t, 0)
	proxy, url := startProxy(t, store.args("127.0.0.1:0", up.url, "--strict-canonical"))
	addr := strings.TrimPrefix(url, "http://")
	client := newClient()

	// The slow-loris client runs beside the rest: the proxy's header
	// timeout is fixed at some seconds.
	slow := make(chan bool, 1)
	go func() {
		slow <- hangsUp(t, addr, "POST /v1/charges HTTP/1.1\r\nHost: x\r\nX-Tenant: t\r\nIdempotency-Key: loris\r\n", 200*time.Millisecond)
	}()

	inputs := hostileInputs()
	classes := map[string]int{}
	for i, in := range inputs {
		req, err := http.NewRequest("POST", url+chargePath, strings.NewReader(in.body))
		require.NoError(t, err)
		applyHeaders(req.Header.Set, req.Header.Del, req.Header.Add, fmt.Sprint("hostile-", i), in)
		classes[in.class]++
		resp, err := client.Do(req)
		if err != nil {
			// The Go client refuses to send some header values (NUL,
			// DEL): they go over a raw connection below.
			require.ErrorContains(t, err, "invalid header field value", "%s %d", in.class, i)
			classes[in.class]--
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if assert.Equal(t, in.status, resp.StatusCode, "%s %d: %.80q -> %s", in.class, i, in.body, body) {
			assert.Equal(t, in.code, reply{header: resp.Header, body: body}.code(), "%s %d", in.class, i)
		}
	}

	// Raw requests: net/http itself refuses these before the middleware,
	// or the middleware refuses them; all with a 4xx.
	raw := []struct {
		name, req string
	}{
		{"NUL in key", "Idempotency-Key: k\x00\r\nX-Tenant: t\r\nContent-Length: 2\r\n\r\n{}"},
		{"DEL in key", "Idempotency-Key: k\x7f\r\nX-Tenant: t\r\nContent-Length: 2\r\n\r\n{}"},
		{"bare CR in key", "Idempotency-Key: k\rx\r\nX-Tenant: t\r\nContent-Length: 2\r\n\r\n{}"},
		{"folded key", "Idempotency-Key: k\r\n x\r\nX-Tenant: t\r\nContent-Length: 2\r\n\r\n{}"},
		{"high bytes in key", "Idempotency-Key: k\xc3\xa9\r\nX-Tenant: t\r\nContent-Length: 2\r\n\r\n{}"},
		{"no colon", "Idempotency-Key k\r\nX-Tenant: t\r\nContent-Length: 2\r\n\r\n{}"},
		{"space before colon", "Idempotency-Key : k\r\nX-Tenant: t\r\nContent-Length: 2\r\n\r\n{}"},
		{"oversized header", "Idempotency-Key: k\r\nX-Tenant: t\r\nX-Junk: " + strings.Repeat("j", 2<<20) + "\r\nContent-Length: 2\r\n\r\n{}"},
		{"two lengths", "Idempotency-Key: k2\r\nX-Tenant: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"},
		{"bad chunk", "Idempotency-Key: k4\r\nX-Tenant: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"},
		{"negative length", "Idempotency-Key: k5\r\nX-Tenant: t\r\nContent-Length: -2\r\n\r\n{}"},
		{"chunked over the cap", "Idempotency-Key: k6\r\nX-Tenant: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
			strings.Repeat(fmt.Sprintf("%x\r\n%s\r\n", 1<<16, strings.Repeat(" ", 1<<16)), 17) + "0\r\n\r\n"},
	}
	for _, r := range raw {
		status := rawRequest(t, addr, "POST "+chargePath+" HTTP/1.1\r\nHost: x\r\n"+r.req)
		classes["raw HTTP"]++
		assert.True(t, status >= 400 && status < 500, "%s: status %d", r.name, status)
	}
	// A body shorter than its Content-Length, then a half-close: the
	// middleware cannot read it whole and stores nothing.
	status := rawRequest(t, addr, "POST "+chargePath+" HTTP/1.1\r\nHost: x\r\nIdempotency-Key: short\r\nX-Tenant: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":1}")
	classes["raw HTTP"]++
	assert.True(t, status == 0 || status == 400, "short body: status %d", status)

	// Another tenant's key: it runs as that tenant's own, and says
	// nothing about the first tenant's request.
	spent := "shared-key"
	first, err := do(context.Background(), client, "POST", url+chargePath, `{"amount":1}`, "Idempotency-Key", spent, crashtest.TenantHeader, "tenant-a")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, first.status)
	for _, body := range []string{`{"amount":1}`, `{"amount":999}`} {
		other, err := do(context.Background(), client, "POST", url+chargePath, body, "Idempotency-Key", spent, crashtest.TenantHeader, "tenant-b"+fmt.Sprint(len(body)))
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, other.status)
		assert.False(t, other.replayed())
		assert.NotEqual(t, first.body, other.body)
		classes["another tenant's key"]++
	}

	assert.True(t, <-slow, "the proxy must hang up on a slow-loris client")
	classes["slow-loris"]++

	assert.Equal(t, 3, up.executions(t), "only the three tenant requests may reach the upstream")
	require.NoError(t, proxy.Signal(syscallTERM()))
	code, err := proxy.Wait(guard)
	require.NoError(t, err)
	require.Equal(t, 0, code, proxy.Stderr())
	assert.Len(t, store.records(t), 3, "only the three tenant requests may be stored")
	total := 0
	for _, v := range classes {
		total += v
	}
	t.Logf("hostile inputs through the proxy: %d, by class %v; upstream executions 3 (the tenant checks), records 3", total, classes)
}

// rawRequest sends req over a new connection, half-closes it, and returns
// the status of the answer, or 0 if the proxy hung up without one.
func rawRequest(t *testing.T, addr, req string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(guard))
	go func() {
		c.Write([]byte(req))
		c.(*net.TCPConn).CloseWrite()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
