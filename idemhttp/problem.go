package idemhttp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// ProblemType is the media type of every error idemhttp answers itself.
const ProblemType = "application/problem+json"

// Problem is an RFC 9457 problem document with idemhttp's code member.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
	// BodyError is the canonicalizer's code for a refused body (syntax,
	// duplicate_member, ...), and BodyOffset the byte where it stopped.
	BodyError  string `json:"body_error,omitempty"`
	BodyOffset *int   `json:"body_offset,omitempty"`
}

// writeProblem answers with p; retry, when positive, becomes Retry-After in
// whole seconds, rounded up so that a client never comes back too early. It
// returns p's code and status, which is what a refusal reports to
// Options.Observe.
func writeProblem(w http.ResponseWriter, p Problem, retry time.Duration) (code string, status int) {
	p.Type = "about:blank"
	p.Title = http.StatusText(p.Status)
	h := w.Header()
	h.Set("Content-Type", ProblemType)
	h.Set("Cache-Control", "no-store")
	if retry > 0 {
		h.Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
	}
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false) // a problem is not HTML; keep details legible
	_ = enc.Encode(p)
	w.WriteHeader(p.Status)
	w.Write(body.Bytes())
	return p.Code, p.Status
}
