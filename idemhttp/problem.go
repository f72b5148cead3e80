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

// DefaultProblemBase begins the type URI of every problem idemhttp answers
// unless Options.ProblemBase says otherwise: followed by the problem's
// code, it names the section of docs/problems.md that documents that code.
// The README keeps an anchor for each code as well, for clients that
// still point at it.
const DefaultProblemBase = "https://github.com/idemkv/idem/blob/main/docs/problems.md#"

// Problem is an RFC 9457 problem document with idemhttp's code member.
type Problem struct {
	// Type identifies the kind of problem: the base URI followed by Code,
	// or "about:blank" when it has no documentation of its own.
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
	// BodyError is the canonicalizer's code for a refused body (syntax,
	// duplicate_member, ...), and BodyOffset the byte where it stopped.
	BodyError  string `json:"body_error,omitempty"`
	BodyOffset *int   `json:"body_offset,omitempty"`
	// OriginalStatus is the status of the stored response that a replay
	// cannot send in full (response_body_omitted, encoding_not_acceptable).
	OriginalStatus int `json:"original_status,omitempty"`
}

// WriteProblem answers with p, titled after its status, so that a service
// answers its own errors in the shape of the middleware's. An empty Type
// is sent as about:blank; any other is also linked as the documentation
// that describes the answer (Link rel="describedby"), as the
// idempotency-key draft asks of its errors. retry, when positive, becomes
// Retry-After in whole seconds, rounded up so that a client never comes
// back too early.
func WriteProblem(w http.ResponseWriter, p Problem, retry time.Duration) {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	p.Title = http.StatusText(p.Status)
	h := w.Header()
	h.Set("Content-Type", ProblemType)
	h.Set("Cache-Control", "no-store")
	if p.Type != "about:blank" {
		h.Add("Link", "<"+p.Type+`>; rel="describedby"`)
	}
	if retry > 0 {
		h.Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
	}
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false) // a problem is not HTML; keep details legible
	_ = enc.Encode(p)
	w.WriteHeader(p.Status)
	w.Write(body.Bytes())
}

// problem answers with p, typed under Options.ProblemBase, and returns
// its code and status, which is what a refusal reports to Options.Observe.
func (m *middleware) problem(w http.ResponseWriter, p Problem, retry time.Duration) (code string, status int) {
	p.Type = m.opts.ProblemBase + p.Code
	WriteProblem(w, p, retry)
	return p.Code, p.Status
}
