package idemhttp_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/pebblestore"
)

// TestReplayKeepsTheRetrysOwnHeaders: headers that layers around the
// middleware set for one request (its ID, the CORS answer for its origin,
// a session cookie) are not the stored response; a retry carries its own.
// What the handler set is replayed: a field it changed from the outer
// layer's value replaces the retry's, values it added go beside them,
// except for the cookies it set, which are never stored.
func TestReplayKeepsTheRetrysOwnHeaders(t *testing.T) {
	var n atomic.Int64
	e := setup(t, idemhttp.Options{}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Request-Id", fmt.Sprintf("req-%d", n.Add(1)))
			w.Header().Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
			w.Header().Set("Cache-Control", "no-cache")
			w.Header().Add("Set-Cookie", fmt.Sprintf("sid=s%d", n.Load()))
			w.Header().Add("Link", fmt.Sprintf("</req/%d>; rel=self", n.Load()))
			w.Header().Set(http.TrailerPrefix+"X-Trace", fmt.Sprintf("t%d", n.Load()))
			next.ServeHTTP(w, r)
		})
	})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "private")
		w.Header().Add("Set-Cookie", "receipt=pay_1")
		w.Header().Add("Link", "</receipts/pay_1>; rel=receipt")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay_1"}`)
	}
	post := func(origin string) *http.Response {
		resp, _ := e.callWith(http.Header{"Origin": {origin}}, "POST", "/v1/payments", "acme", pay, "rid")
		return resp
	}
	first := post("https://a.example")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Equal(t, "req-1", first.Header.Get("X-Request-Id"))

	again := post("https://b.example")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "req-2", again.Header.Get("X-Request-Id"))
	assert.Equal(t, "https://b.example", again.Header.Get("Access-Control-Allow-Origin"))
	assert.Equal(t, "private", again.Header.Get("Cache-Control"), "the handler's own value")
	assert.Equal(t, []string{"sid=s2"}, again.Header.Values("Set-Cookie"), "the retry's session, and no stored cookie")
	assert.Equal(t, []string{"</req/2>; rel=self", "</receipts/pay_1>; rel=receipt"}, again.Header.Values("Link"), "the retry's link, the handler's")
	assert.Equal(t, "t2", again.Trailer.Get("X-Trace"), "the retry's own trailer")
	assert.Equal(t, "application/json", again.Header.Get("Content-Type"))
	assert.Equal(t, int64(1), e.app.runs.Load())
}

func TestKeyEchoedOnceEvenIfTheHandlerAddsIt(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Idempotency-Key", r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusCreated)
	}
	first, _ := e.call("POST", "/v1/payments", "acme", pay, "echo")
	again, _ := e.call("POST", "/v1/payments", "acme", pay, "echo")
	assert.Equal(t, []string{"echo"}, first.Header.Values("Idempotency-Key"))
	assert.Equal(t, []string{"echo"}, again.Header.Values("Idempotency-Key"))
}

// TestTrailersAreSentAndReplayed: trailers, declared before the status or
// named with http.TrailerPrefix, are set after the body; they reach the
// first client and are part of what a retry gets back.
func TestTrailersAreSentAndReplayed(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
		w.Header().Set("X-Checksum", "abc123")
		w.Header().Set(http.TrailerPrefix+"X-Late", "zz")
	}
	for i, want := range []string{"", "true"} {
		resp, body := e.call("POST", "/v1/payments", "acme", pay, "tr")
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, want, resp.Header.Get("Idempotent-Replayed"), "call %d", i)
		assert.Equal(t, "paid", body)
		assert.Equal(t, "abc123", resp.Trailer.Get("X-Checksum"), "call %d", i)
		assert.Equal(t, "zz", resp.Trailer.Get("X-Late"), "call %d", i)
		assert.Empty(t, resp.Header.Get("X-Checksum"), "a trailer is not a header")
	}
	assert.Equal(t, int64(1), e.app.runs.Load())
}

// TestReplayFramesTrailersAsTheFirstAnswer: the first answer and its
// replay carry the same trailers and the same framing, whether the
// trailers were set before the first flush, named only with the prefix on
// a short body (which net/http would otherwise send with a length and no
// trailers), or come with a declared length (then there are none).
func TestReplayFramesTrailersAsTheFirstAnswer(t *testing.T) {
	for name, h := range map[string]http.HandlerFunc{
		"set before the first flush": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Checksum")
			w.WriteHeader(http.StatusCreated)
			w.Header().Set("X-Checksum", "abc123")
			w.Header().Set(http.TrailerPrefix+"X-Early", "ee")
			io.WriteString(w, "pa")
			http.NewResponseController(w).Flush()
			io.WriteString(w, "id")
		},
		"undeclared, short body": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
			w.Header().Set(http.TrailerPrefix+"X-Sum", "zz")
		},
		"declared length": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "4")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
			w.Header().Set(http.TrailerPrefix+"X-Sum", "zz")
		},
		"declared length, trailer set before the status": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "4")
			w.Header().Set(http.TrailerPrefix+"X-Sum", "zz")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
		},
		"declared, never set": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Error")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := setup(t, idemhttp.Options{})
			e.app.handler = h
			first, body := e.call("POST", "/v1/payments", "acme", pay, "tf")
			require.Equal(t, http.StatusCreated, first.StatusCode)
			assert.Equal(t, "paid", body)
			again, body := e.call("POST", "/v1/payments", "acme", pay, "tf")
			require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
			assert.Equal(t, "paid", body)
			assert.Equal(t, first.Trailer, again.Trailer)
			assert.Equal(t, first.ContentLength, again.ContentLength)
			if !strings.HasPrefix(name, "declared length") {
				assert.NotEmpty(t, first.Trailer, "the handler's trailers reach the client")
			}
		})
	}
}

// TestHTTP2ReplaysTrailersBesideALength: HTTP/2 sends trailers whatever
// the length, so its replay does too.
func TestHTTP2ReplaysTrailersBesideALength(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.useHTTP2()
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "4")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
		w.Header().Set(http.TrailerPrefix+"X-Sum", "zz")
	}
	first, body := e.call("POST", "/v1/payments", "acme", pay, "h2")
	require.Equal(t, 2, first.ProtoMajor)
	assert.Equal(t, "paid", body)
	again, body := e.call("POST", "/v1/payments", "acme", pay, "h2")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "paid", body)
	assert.Equal(t, "zz", first.Trailer.Get("X-Sum"))
	assert.Equal(t, first.Trailer, again.Trailer)
}

// TestWritesPastTheDeclaredLengthAreRefused: net/http refuses a write
// that would pass the Content-Length the handler declared, so the first
// client never gets it; neither does a retry.
func TestWritesPastTheDeclaredLengthAreRefused(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "4")
		w.WriteHeader(http.StatusCreated)
		_, err := io.WriteString(w, "paid")
		assert.NoError(t, err)
		_, err = io.WriteString(w, "!")
		assert.ErrorIs(t, err, http.ErrContentLength)
	}
	for range 2 {
		resp, body := e.call("POST", "/v1/payments", "acme", pay, "cl")
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, "paid", body)
	}
	assert.Equal(t, int64(1), e.app.runs.Load())
}

// TestReplayKeepsADeclaredLength: a length the handler declared frames
// the replay as it framed the first answer, also past net/http's buffer,
// where an undeclared one would be chunked.
func TestReplayKeepsADeclaredLength(t *testing.T) {
	db, _ := idemtest.Open(t, &pebblestore.Options{InlineBodyBytes: 4 << 10, MaxBodyBytes: 4 << 10})
	e := setup(t, idemhttp.Options{Store: db})
	size := 4 << 10
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("x", size))
	}
	first, body := e.call("POST", "/v1/payments", "acme", pay, "cl")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Len(t, body, size)
	again, body := e.call("POST", "/v1/payments", "acme", pay, "cl")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Len(t, body, size)
	assert.Equal(t, int64(size), first.ContentLength)
	assert.Equal(t, first.ContentLength, again.ContentLength)
}

// TestOmittedBodyIsNotReplayedAsSuccess: a response whose body was too
// large to keep cannot be replayed, and a client that does not know idem's
// headers must not take the replay for a successful empty answer. It gets
// 410 response_body_omitted with the original status, which no common
// retrying client retries: a retry would get the same, and a new key
// would run the operation again.
func TestOmittedBodyIsNotReplayedAsSuccess(t *testing.T) {
	db, _ := idemtest.Open(t, &pebblestore.Options{InlineBodyBytes: 4 << 10, MaxBodyBytes: 4 << 10})
	e := setup(t, idemhttp.Options{Store: db})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(4<<10+1))
		w.Header().Set("Location", "/v1/payments/pay_big")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `"`+strings.Repeat("x", 4<<10-1)+`"`)
	}
	first, body := e.call("POST", "/v1/payments", "acme", pay, "omitted")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Len(t, body, 4<<10+1, "the first answer is whole")

	again, body := e.call("POST", "/v1/payments", "acme", pay, "omitted")
	assert.Equal(t, http.StatusGone, again.StatusCode)
	p := problem(t, again, body)
	assert.Equal(t, idem.CodeResponseBodyOmitted, p.Code)
	assert.Equal(t, http.StatusCreated, p.OriginalStatus)
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "true", again.Header.Get("Idempotent-Body-Omitted"))
	assert.Empty(t, again.Header.Get("Location"), "the stored headers describe a body that is not sent")
	assert.Empty(t, again.Header.Get("Retry-After"))
	assert.Equal(t, int64(1), e.app.runs.Load())
}

// TestHijackedAnswerIsNotReplayed: a handler that takes the connection
// answers where the recorder cannot see, so there is no response to store.
// The record becomes unknown and a retry gets 409 outcome_pending, never a
// made-up empty 200 marked as a replay.
func TestHijackedAnswerIsNotReplayed(t *testing.T) {
	seen := make(chan idem.Observation, 2)
	e := setup(t, idemhttp.Options{Observe: func(o idem.Observation) { seen <- o }})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if !assert.NoError(t, err) {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 202 Accepted\r\nContent-Length: 7\r\nConnection: close\r\n\r\nqueued!")
		rw.Flush()
	}
	resp, body := e.call("POST", "/v1/payments", "acme", pay, "h")
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	assert.Equal(t, "queued!", body)
	// The client has its answer before the middleware stores the outcome.
	o := <-seen
	assert.Equal(t, idem.OutcomeHijacked, o.Outcome)
	assert.Zero(t, o.Status)

	resp, body = e.call("POST", "/v1/payments", "acme", pay, "h")
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Equal(t, idem.CodeOutcomePending, problem(t, resp, body).Code)
	assert.Empty(t, resp.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(1), e.app.runs.Load())
}

func TestStreamedResponseIsFlushedAndStored(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	next := make(chan struct{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part one\n")
		require.NoError(t, http.NewResponseController(w).Flush())
		<-next
		io.WriteString(w, "part two\n")
	}
	resp, err := e.srv.Client().Do(e.request(nil, "POST", "/v1/payments", "acme", pay, "s"))
	require.NoError(t, err)
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "part one\n", line, "the first part arrives before the handler finishes")
	close(next)
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "part two\n", string(rest))
	require.NoError(t, e.db.Wait(context.Background(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "s"}))
	_, body := e.call("POST", "/v1/payments", "acme", pay, "s")
	assert.Equal(t, "part one\npart two\n", body)
}

// TestStreamKeepsItsEndUntilStored lets a flushing handler stream, but the
// client gets the last byte only once the outcome is stored; if storing
// fails the connection breaks instead, so no client ever holds a complete
// answer that a retry cannot replay.
func TestStreamKeepsItsEndUntilStored(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("store fails=%v", fail), func(t *testing.T) {
			e := setup(t, idemhttp.Options{})
			proceed := make(chan struct{})
			e.app.handler = func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "4")
				io.WriteString(w, "paid")
				http.NewResponseController(w).Flush()
				<-proceed
				if fail {
					assert.NoError(t, e.db.Close())
				}
			}
			resp, err := e.srv.Client().Do(e.request(nil, "POST", "/v1/payments", "acme", pay, "stream-1"))
			require.NoError(t, err)
			defer resp.Body.Close()
			head := make([]byte, 3)
			_, err = io.ReadFull(resp.Body, head)
			require.NoError(t, err, "the stream flows while the handler runs")
			assert.Equal(t, "pai", string(head))
			close(proceed)
			rest, err := io.ReadAll(resp.Body)
			if fail {
				assert.Error(t, err, "a stream whose outcome was not stored must not end cleanly")
				assert.Empty(t, rest)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "d", string(rest))
			again, body := e.call("POST", "/v1/payments", "acme", pay, "stream-1")
			assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
			assert.Equal(t, "paid", body)
		})
	}
}

// TestReplayHonoursAcceptEncoding: a replay is coded as the first answer
// was, which the retry may not accept. A gzip body is decoded for a retry
// that refuses gzip; a coding the middleware cannot decode gets 406
// encoding_not_acceptable, naming it, rather than bytes the client cannot
// read. A retry that accepts the coding, or says nothing, gets the bytes
// as stored.
func TestReplayHonoursAcceptEncoding(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	const doc = `{"id":"pay_1"}`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, doc)
	require.NoError(t, zw.Close())
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		coding := r.URL.Query().Get("coding")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", coding)
		w.Header().Set("ETag", `"v1-`+coding+`"`)
		w.Header().Set("Content-Length", strconv.Itoa(gz.Len()))
		w.WriteHeader(http.StatusCreated)
		w.Write(gz.Bytes()) // as good as br for a test: never decoded
	}
	call := func(coding, key, accept string) (*http.Response, string) {
		t.Helper()
		var h http.Header
		if accept != "-" {
			h = http.Header{"Accept-Encoding": {accept}}
		}
		return e.callWith(h, "POST", "/v1/payments?coding="+coding, "acme", pay, key)
	}
	first, body := call("gzip", "gz", "gzip")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Equal(t, gz.String(), body)

	for _, accept := range []string{"identity", "br, deflate", "gzip;q=0, *", "*;q=0, identity", "GZIP;q=0.000"} {
		again, body := call("gzip", "gz", accept)
		assert.Equal(t, http.StatusCreated, again.StatusCode, accept)
		assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), accept)
		assert.Equal(t, doc, body, "Accept-Encoding %q: decoded", accept)
		assert.Empty(t, again.Header.Get("Content-Encoding"), accept)
		assert.Empty(t, again.Header.Get("ETag"), "the tag named the gzip bytes")
		assert.Equal(t, "application/json", again.Header.Get("Content-Type"))
	}
	for _, accept := range []string{"gzip", "x-gzip", "br, gzip;q=0.5", "*", "identity;q=0.5, *;q=0.1"} {
		again, body := call("gzip", "gz", accept)
		assert.Equal(t, gz.String(), body, "Accept-Encoding %q: as stored", accept)
		assert.Equal(t, "gzip", again.Header.Get("Content-Encoding"), accept)
		assert.Equal(t, `"v1-gzip"`, again.Header.Get("ETag"))
	}

	first, _ = call("br", "br", "br")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	again, body := call("br", "br", "identity")
	assert.Equal(t, http.StatusNotAcceptable, again.StatusCode)
	p := problem(t, again, body)
	assert.Equal(t, idem.CodeEncodingNotAcceptable, p.Code)
	assert.Equal(t, http.StatusCreated, p.OriginalStatus)
	assert.Contains(t, p.Detail, "br")
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	again, _ = call("br", "br", "br;q=1")
	assert.Equal(t, http.StatusCreated, again.StatusCode)
	assert.Equal(t, int64(2), e.app.runs.Load())
}

// TestReplayBoundsDecoding: a small stored gzip body that inflates beyond
// MaxDecodedBytes is not inflated for a retry that refuses gzip, which
// gets 406 decoded_body_too_large instead; a body at the bound still is.
func TestReplayBoundsDecoding(t *testing.T) {
	const limit = 64 << 10
	e := setup(t, idemhttp.Options{MaxDecodedBytes: limit})
	bomb := func(n int) []byte {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write(make([]byte, n))
		require.NoError(t, zw.Close())
		return gz.Bytes()
	}
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		w.Write(bomb(n))
	}
	call := func(n int, key, accept string) (*http.Response, string) {
		t.Helper()
		return e.callWith(http.Header{"Accept-Encoding": {accept}}, "POST", "/v1/payments?n="+strconv.Itoa(n), "acme", pay, key)
	}
	big := 64 * limit
	first, body := call(big, "bomb", "gzip")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Less(t, len(body), limit/8, "the stored body is small")

	again, body := call(big, "bomb", "identity")
	assert.Equal(t, http.StatusNotAcceptable, again.StatusCode)
	p := problem(t, again, body)
	assert.Equal(t, idem.CodeDecodedTooLarge, p.Code)
	assert.Equal(t, http.StatusCreated, p.OriginalStatus)
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	again, body = call(big, "bomb", "gzip")
	assert.Equal(t, http.StatusCreated, again.StatusCode)
	assert.Equal(t, string(bomb(big)), body, "a retry that accepts gzip gets the bytes as stored")

	_, _ = call(limit, "fits", "gzip")
	again, body = call(limit, "fits", "identity")
	assert.Equal(t, http.StatusCreated, again.StatusCode)
	assert.Len(t, body, limit)
	assert.Equal(t, int64(2), e.app.runs.Load())
}
