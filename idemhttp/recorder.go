package idemhttp

import (
	"bufio"
	"bytes"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkv/idem"
)

// recorder holds a handler's response and keeps a copy to store. The
// status and body reach the client only through send, once the outcome is
// stored, unless the handler flushes: then it is streaming (server-sent
// events, a long download), and what it writes goes out as it comes, all
// but the very end: the last byte of a declared Content-Length, or the end
// of a chunked body, which net/http writes after the handler returns. So a
// client never reads a whole response that its retry could not get back.
// It is the only ResponseWriter wrapper: Unwrap lets
// http.NewResponseController reach the connection's deadlines, and Hijack
// is its own, so that the middleware knows when the handler answered
// where the recorder cannot see.
type recorder struct {
	w http.ResponseWriter
	// outer is the header as the handler found it, holding what the
	// layers around the middleware set for this one request (a request
	// ID, a CORS answer for its origin). They set their own again on a
	// retry, so only the fields the handler added or changed are stored.
	outer     http.Header
	status    int
	header    http.Header // what the handler had set when it wrote the status
	sent      http.Header // the same, every field, to put back when it is sent
	length    int64       // the declared Content-Length, or -1
	body      bytes.Buffer
	streaming bool // the handler flushed
	hijacked  bool // the handler took the connection
	h2        bool // HTTP/2 or later, which sends trailers beside a declared length
	overran   bool // the handler wrote past the declared length
	out       int  // bytes of body the client was given
	// expires is the key's expiry as an HTTP-date, which a streamed
	// answer carries from its start.
	expires string
}

func (r *recorder) Header() http.Header { return r.w.Header() }

func (r *recorder) WriteHeader(status int) {
	if r.status != 0 {
		return
	}
	// Informational answers (100 Continue, 103 Early Hints) are not the
	// outcome: pass them on and wait for the real one.
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		r.w.WriteHeader(status)
		return
	}
	// A handler may have added the key again (a proxy copying an upstream
	// echo); the answer carries it once, as its replay will.
	if vs := r.w.Header().Values(idem.HeaderKey); len(vs) > 1 {
		r.w.Header().Set(idem.HeaderKey, vs[0])
	}
	r.status = status
	r.header = storableHeader(r.w.Header(), r.outer)
	r.sent = r.w.Header().Clone()
	r.length = -1
	// Most handlers leave the length to net/http; parsing "" would build
	// an error on every request.
	if cl := r.sent.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			r.length = n
		}
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	// net/http refuses a write that would pass a declared Content-Length,
	// and every write after it; so does the recorder, so that a replay
	// holds what the first client got.
	if r.length >= 0 && (r.overran || int64(r.body.Len())+int64(len(p)) > r.length) {
		r.overran = true
		return 0, http.ErrContentLength
	}
	// A client that went away must not stop the recording: the retry it
	// sends next should find the whole response.
	r.body.Write(p)
	if r.streaming {
		r.pass(false)
	}
	return len(p), nil
}

// Flush starts streaming: what is held goes to the client now, but for
// its end, and so does everything written after.
func (r *recorder) Flush() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !r.streaming {
		r.streaming = true
		// The header leaves now, before the outcome is stored: it says
		// when the key expires if the answer is stored.
		if r.expires != "" {
			r.sent.Set(idem.HeaderExpires, r.expires)
		}
		r.writeStatus()
	}
	r.pass(false)
	_ = http.NewResponseController(r.w).Flush()
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// Hijack hands the connection to the handler. Whatever it then sends goes
// around the recorder, so its outcome is stored as unknown: a response the
// recorder never saw must not be replayed as if it were the answer.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(r.w).Hijack()
	if err == nil {
		r.hijacked = true
	}
	return conn, rw, err
}

// writeStatus writes the status with the header as it was when the handler
// wrote it: later changes are ignored, as net/http ignores them, except
// the trailers' values, which are set after the status by design and are
// put back once it is written. It returns those trailers, nil if none.
func (r *recorder) writeStatus() http.Header {
	h := r.w.Header()
	tr := r.trailers(false)
	clear(h)
	maps.Copy(h, r.sent)
	r.w.WriteHeader(r.status)
	maps.Copy(h, tr)
	return tr
}

// pass gives the client the body written so far; unless all is set, it
// keeps back the last byte of a declared length.
func (r *recorder) pass(all bool) {
	end := r.body.Len()
	if !all && r.length >= 0 && int64(end) >= r.length {
		end = int(r.length) - 1
	}
	if end > r.out {
		r.w.Write(r.body.Bytes()[r.out:end])
		r.out = end
	}
}

// send lets the response reach the client in full, once its outcome is
// stored, and returns its status.
func (r *recorder) send() int {
	if r.status == 0 {
		// The handler wrote nothing: net/http answers 200 with no body.
		return http.StatusOK
	}
	var tr http.Header
	if !r.streaming {
		tr = r.writeStatus()
	}
	r.pass(true)
	if tr != nil && r.length < 0 {
		// net/http gives an answer that was never flushed a
		// Content-Length, and then sends no trailers; flushed, it is
		// chunked and they go out, as they do in its replay.
		_ = http.NewResponseController(r.w).Flush()
	}
	return r.status
}

// setHeader sets a field of the answer that is not part of the stored
// response, such as its expiry; it reaches the client only if the status
// has not been written yet.
func (r *recorder) setHeader(name, value string) {
	r.w.Header().Set(name, value)
	if r.sent != nil {
		r.sent.Set(name, value)
	}
}

// response is what the recorder saw, as it is stored.
func (r *recorder) response() (status int, header http.Header, body []byte) {
	if r.status == 0 {
		return http.StatusOK, storableHeader(r.w.Header(), r.outer), nil
	}
	if r.length >= 0 && !r.h2 {
		// Over HTTP/1.1 an answer with a declared length has no trailers,
		// so neither has its replay, even one declared or set early.
		maps.DeleteFunc(r.header, func(k string, _ []string) bool {
			return k == "Trailer" || strings.HasPrefix(k, http.TrailerPrefix)
		})
	} else {
		// Like the header, trailers that outer layers set are theirs.
		for k, vs := range r.trailers(true) {
			if !slices.Equal(vs, r.outer[k]) {
				r.header[k] = vs
			}
		}
	}
	return r.status, r.header, r.body.Bytes()
}

// trailers returns the trailers the handler has set: the fields it
// declared in a Trailer header before it wrote the status, and those it
// named with http.TrailerPrefix, or nil if none. With prefixed, every key
// carries the prefix, with which net/http sends a field as a trailer
// whether or not it was declared: that is how they are stored and
// replayed. Without, each keeps the name it was set under, so that a
// handler setting it again later replaces it.
func (r *recorder) trailers(prefixed bool) http.Header {
	h := r.w.Header()
	var out http.Header // most responses have none
	add := func(k string, vs []string) {
		if out == nil {
			out = http.Header{}
		}
		out[k] = slices.Clone(vs)
	}
	for _, v := range r.sent.Values("Trailer") {
		for name := range strings.SplitSeq(v, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if vs, ok := h[name]; ok && name != "" {
				if prefixed {
					name = http.TrailerPrefix + name
				}
				add(name, vs)
			}
		}
	}
	for k, vs := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			add(k, vs)
		}
	}
	return out
}

// hopByHop are the headers that describe one connection, not the response
// (RFC 9110 section 7.6.1), plus those idemhttp sets on each answer itself.
// A declared Content-Length and Trailer are kept: they frame the answer,
// and a replay is framed as the first answer was.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Transfer-Encoding": true, "Upgrade": true, "Date": true,
	idem.HeaderKey: true, idem.HeaderReplayed: true, idem.HeaderBodyOmitted: true, idem.HeaderExpires: true,
}

// appendPrefix marks, in a stored header, the values a handler added to a
// field after those an outer layer had set for its request (a cookie
// beside the session's): a replay adds them to the retry's own values
// instead of replacing those. Like http.TrailerPrefix, it holds a ':',
// which no field name can.
const appendPrefix = "Append:"

// storableHeader copies the headers worth replaying: those of h that are
// not hop-by-hop and differ from outer, and of a field the handler only
// added to, the values it added. A field the handler deleted from outer,
// or set to outer's value, cannot be told apart from one it left alone,
// and is not stored.
func storableHeader(h, outer http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, vs := range h {
		was := outer[k]
		switch {
		case hopByHop[k] || slices.Equal(vs, was):
		case len(was) > 0 && len(vs) > len(was) && slices.Equal(vs[:len(was)], was):
			out[appendPrefix+k] = slices.Clone(vs[len(was):])
		default:
			out[k] = slices.Clone(vs)
		}
	}
	return out
}
