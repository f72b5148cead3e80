package idemhttp

import (
	"bytes"
	"net/http"
)

// recorder passes a handler's response through to the client as it is
// written and keeps a copy to store. It is the only ResponseWriter wrapper:
// Unwrap lets http.NewResponseController reach the connection's Flush,
// deadlines and hijacking.
type recorder struct {
	w      http.ResponseWriter
	status int
	header http.Header // what the handler had set when it wrote the status
	body   bytes.Buffer
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
	r.status = status
	r.header = storableHeader(r.w.Header())
	// A handler may have added the key again (a proxy copying an upstream
	// echo); the answer carries it once, as its replay will.
	if vs := r.w.Header().Values(headerKey); len(vs) > 1 {
		r.w.Header().Set(headerKey, vs[0])
	}
	r.w.WriteHeader(status)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	r.body.Write(p)
	// A client that went away must not stop the recording: the retry it
	// sends next should find the whole response.
	n, err := r.w.Write(p)
	if err != nil {
		return len(p), nil
	}
	return n, nil
}

// Flush sends what is buffered to the client now, for streamed responses.
func (r *recorder) Flush() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(r.w).Flush()
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// response is what the recorder saw, as it is stored.
func (r *recorder) response() (status int, header http.Header, body []byte) {
	if r.status == 0 {
		// The handler wrote nothing: net/http answers 200 with no body.
		return http.StatusOK, storableHeader(r.w.Header()), nil
	}
	return r.status, r.header, r.body.Bytes()
}

// hopByHop are the headers that describe one connection, not the response
// (RFC 9110 section 7.6.1), plus those idemhttp sets on each answer itself.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, "Date": true,
	headerKey: true, headerReplayed: true, headerBodyOmitted: true,
}

// storableHeader copies the headers worth replaying.
func storableHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, vs := range h {
		if hopByHop[k] {
			continue
		}
		out[k] = append([]string(nil), vs...)
	}
	return out
}
