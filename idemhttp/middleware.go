// Package idemhttp puts idem's idempotency contract in front of any
// net/http handler: a POST (or any unsafe request) with an Idempotency-Key
// runs once, its response is stored durably, and every retry gets that
// response again, marked Idempotent-Replayed: true. Retries that arrive while the first request
// runs get 409 request_in_progress with Retry-After; the same key with a
// different request gets 422 idempotency_key_reuse; a missing or malformed
// key gets 400. Every refusal is an RFC 9457 problem document with a
// stable code and a type of its own, Options.ProblemBase followed by the
// code, which the answer links to as its documentation.
//
// A stored answer and every replay of it carry Idempotency-Key-Expires,
// the HTTP-date at which the key's record expires and a retry would run
// the operation again; an answer that was not stored does not, unless it
// streamed, since a streamed answer's header leaves before its outcome is
// known.
//
// Every answer is stored by default, errors included. Options.Outcomes
// names the statuses that free the key instead (nothing was committed) or
// leave its outcome unknown, and a handler may say so itself with
// Release, MarkUnknown or Keep.
package idemhttp

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idem"
)

// Options configure the middleware. Store and Tenant are required; every
// other zero value selects the default given in its comment.
type Options struct {
	// Store keeps the records: the embedded store (pebblestore.Open) or any
	// other backend of the contract. Required.
	Store idem.Store

	// Tenant returns the authenticated caller a request belongs to: keys
	// are scoped by it, so one tenant can never see another's responses.
	// An error answers 401 tenant_missing, in words of the middleware's:
	// the error itself is logged at debug level, never sent. Authenticate
	// before this middleware runs; the key is never a credential.
	// Required.
	Tenant func(*http.Request) (string, error)

	// Endpoint names the operation a request performs. Default: the
	// ServeMux pattern that matched (Go 1.22+, when the middleware wraps
	// the route's handler), prefixed with the method when the pattern has
	// none, else the method and the URL path.
	Endpoint func(*http.Request) string

	// Methods are the request methods that must carry a key. A request
	// with another unsafe method (anything but GET, HEAD, OPTIONS and
	// TRACE) is protected too when it carries a key, and passes straight
	// through when it does not; safe methods always pass through unless
	// listed here. Default: POST.
	Methods []string

	// Header is the field that carries the key. Default: Idempotency-Key.
	Header string
	// Aliases are further accepted names, e.g. X-Idempotency-Key during a
	// migration. A request may use only one of them, once.
	Aliases []string
	// KeyAlphabet is the set of characters a key may contain.
	// Default: idem.DefaultKeyAlphabet.
	KeyAlphabet string
	// MaxKeyLength bounds a key's length, at most idem.MaxKeyBytes.
	// Default: 255.
	MaxKeyLength int

	// Canonical says how request bodies are canonicalized before they are
	// fingerprinted: the number profile and the volatile JSON members
	// (client timestamps, trace IDs) to leave out. Its MaxBytes must stay
	// zero: MaxRequestBytes is the body's one limit. Default: the exact
	// profile, nothing volatile.
	Canonical idem.CanonicalOptions

	// RawFallback fingerprints a JSON or form body that Canonical refuses
	// (duplicate members, NaN, nesting deeper than its MaxDepth, a bare %
	// in a form) as the bytes that arrived, instead of answering 400
	// request_body_invalid: for a handler whose own parser accepts such
	// bodies. A retry of such a request must send the same bytes. Its
	// fingerprint never equals that of a body that canonicalizes (see
	// idem.Request.Raw). Default: false, refuse.
	RawFallback bool

	// MaxRequestBytes bounds the request body, both what is read and what
	// is fingerprinted; a longer one gets 413 payload_too_large.
	// Default: 1 MiB.
	MaxRequestBytes int64

	// MaxDecodedBytes bounds the body a replay inflates for a retry that
	// refuses the stored gzip coding: a few kilobytes of gzip can inflate
	// to gigabytes. A larger one gets 406 decoded_body_too_large, asking
	// the client to accept gzip. Default: idem.DefaultMaxBodyBytes.
	MaxDecodedBytes int64

	// Replay says what of an answer is kept for replays. Default:
	// ReplayAll.
	Replay ReplayPolicy

	// StatusHeaders lists the response header fields kept beside the
	// status of an answer Replay keeps only the status of (a Location,
	// a request ID), and sent with the 410 a retry of it gets. Unstored
	// fields stay out all the same. Default: none.
	StatusHeaders []string

	// Regenerate, when set, answers a retry of an answer whose body was
	// not kept (kept as its status, or too large) from the service's own
	// records, in place of 410 response_body_omitted: a fresh signed URL
	// rather than an expired one. It gets the retry's request and the
	// stored record (status, kept headers, scope); its answer is sent as
	// a replay and stored nowhere. false sends the 410. Default: none.
	Regenerate func(r *http.Request, rec *idem.Record) (idem.Response, bool)

	// Unstored lists response header fields never stored, so never
	// replayed: the first caller gets them, a retry does not. They carry
	// credentials a replay would hand to whoever holds the key and the
	// tenant, long after they were issued. Names are matched
	// case-insensitively. Default (nil): DefaultUnstored; an empty
	// non-nil slice stores every field.
	Unstored []string

	// AuthorizeReplay, when set, is asked before a stored answer is sent
	// again, with the retry's request: a stored answer is served without
	// the handler, so without it a credential revoked since the first
	// request keeps getting its answers until the key expires. An error
	// matching ErrReplayForbidden answers 403 replay_forbidden; any other
	// answers 503 replay_check_failed, since an answer that cannot be
	// checked is not sent. Default: none, replay to any caller the Tenant
	// function accepts.
	AuthorizeReplay func(*http.Request) error

	// Wait is how long a retry that finds its key in progress waits for
	// the first request to finish before it gets 409. The first request's
	// end wakes it, and the retry then gets the replay. Default: 0, answer
	// 409 at once.
	Wait time.Duration

	// MismatchStatus is the status for a key reused with another request.
	// Default: 422.
	MismatchStatus int

	// ProblemBase begins the type URI of every problem the middleware
	// answers: the type is ProblemBase followed by the problem's code, and
	// each answer links to it (Link rel="describedby"). It must be an
	// absolute URI; point it at your own documentation with a page or an
	// anchor per code. Default: DefaultProblemBase, docs/problems.md.
	ProblemBase string

	// Outcomes says which of the handler's statuses free the key or leave
	// its outcome unknown instead of being stored, when the handler does
	// not say itself (Release, MarkUnknown, Keep). Default: every response
	// is stored and replayed, errors included, as Stripe does: a retry
	// gets what the first attempt got.
	Outcomes OutcomePolicy

	// Logger receives failures to store outcomes. Default: slog.Default().
	Logger *slog.Logger

	// Observe, when set, is called once for each request that needs a key,
	// after its answer was written, with what the middleware did: for
	// metrics such as the replay ratio and the 409 and 422 rates. It runs
	// on the request's goroutine, so it must be quick. Default: none.
	Observe func(idem.Observation)
}

// DefaultUnstored are the response fields Options.Unstored names by
// default: cookies and the fields that carry or challenge credentials.
var DefaultUnstored = []string{"Set-Cookie", "Authorization", "Proxy-Authorization",
	"WWW-Authenticate", "Proxy-Authenticate", "Authentication-Info", "Proxy-Authentication-Info"}

// ReplayPolicy says what of a handler's answer a store keeps for replays.
// The key deduplicates alike under every policy: retries never run the
// handler again, and get 409 and 422 as always.
type ReplayPolicy int

const (
	// ReplayAll keeps every answer whole and replays it verbatim, as
	// Stripe does: the store is scoped by tenant, like a private cache.
	ReplayAll ReplayPolicy = iota
	// ReplayPublic keeps only the status of an answer whose Cache-Control
	// says no-store or private, and the rest whole.
	ReplayPublic
	// ReplayStatus keeps only the status of every answer: for endpoints
	// whose answers hold one-time secrets or short-lived signed URLs.
	ReplayStatus
)

// OutcomePolicy says, by status, which responses do not become the key's
// answer. A status it does not list is stored and replayed. The zero value
// stores every response. A status may be in one list only.
type OutcomePolicy struct {
	// Release lists statuses that mean nothing was committed (429 Too Many
	// Requests, a 503 from a load shedder): the response reaches the client
	// but is not stored, and the key is freed, so a retry runs the handler
	// again.
	Release []int
	// Unknown lists statuses after which the operation may or may not have
	// taken effect (a 504 from a gateway in front of it): the response
	// reaches the client, the record becomes unknown, and retries get 409
	// outcome_pending until it is resolved.
	Unknown []int
}

// middleware is the validated configuration behind the handler.
type middleware struct {
	opts      Options
	canonical idem.CanonicalOptions // opts.Canonical bounded by MaxRequestBytes
	headers   []string
	unstored  []string // Options.Unstored, canonical
	kept      []string // Options.StatusHeaders, canonical
	methods   map[string]bool
	keys      *idem.KeySyntax
	release   map[int]bool // Outcomes.Release
	unknown   map[int]bool // Outcomes.Unknown
	do        *idem.DoOptions
	// pathEndpoint: the endpoint is defaultEndpoint, the URL path when no
	// ServeMux pattern matched.
	pathEndpoint bool
}

// New validates o and returns the middleware. Wrap each route's handler
// (mux.Handle("POST /v1/payments", mw(h))) so that the route pattern names
// the endpoint, or the whole mux with Options.Endpoint set.
func New(o Options) (func(http.Handler) http.Handler, error) {
	m, err := newMiddleware(o)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

func newMiddleware(o Options) (*middleware, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: idemhttp: "+format, append([]any{idem.ErrInvalidOptions}, args...)...))
	}
	if o.Store == nil {
		bad("Options.Store is required")
	}
	if o.Tenant == nil {
		bad("Options.Tenant is required: keys must be scoped by the authenticated caller")
	}
	pathEndpoint := o.Endpoint == nil
	if pathEndpoint {
		o.Endpoint = defaultEndpoint
	}
	if len(o.Methods) == 0 {
		o.Methods = []string{http.MethodPost}
	}
	if o.Header == "" {
		o.Header = idem.HeaderKey
	}
	if o.MaxRequestBytes == 0 {
		o.MaxRequestBytes = 1 << 20
	}
	if o.MaxDecodedBytes == 0 {
		o.MaxDecodedBytes = idem.DefaultMaxBodyBytes
	}
	if o.MismatchStatus == 0 {
		o.MismatchStatus = http.StatusUnprocessableEntity
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ProblemBase == "" {
		o.ProblemBase = DefaultProblemBase
	}
	if o.Unstored == nil {
		o.Unstored = DefaultUnstored
	}
	names := append([]string{o.Header}, o.Aliases...)
	m := &middleware{opts: o, pathEndpoint: pathEndpoint, headers: canonicalNames(names), unstored: canonicalNames(o.Unstored), kept: canonicalNames(o.StatusHeaders), methods: map[string]bool{},
		release: map[int]bool{}, unknown: map[int]bool{}}
	// Two spellings of one header would make every key arrive twice, and
	// every request a 400 for a duplicate key.
	for i, n := range m.headers {
		if j := slices.Index(m.headers, n); j < i {
			bad("Options.Aliases: %q is the same header as %q", names[i], names[j])
		}
	}
	for _, meth := range o.Methods {
		if meth != strings.ToUpper(meth) || meth == "" {
			bad("Options.Methods: %q is not an upper-case method", meth)
		}
		m.methods[meth] = true
	}
	keys, err := idem.NewKeySyntax(o.KeyAlphabet, o.MaxKeyLength)
	if err != nil {
		errs = append(errs, fmt.Errorf("%w (idemhttp: Options.KeyAlphabet, Options.MaxKeyLength)", err))
	}
	m.keys = keys
	if o.MaxRequestBytes < 0 {
		bad("Options.MaxRequestBytes %d must not be negative", o.MaxRequestBytes)
	}
	if o.MaxDecodedBytes < 0 {
		bad("Options.MaxDecodedBytes %d must not be negative", o.MaxDecodedBytes)
	}
	// Two limits on one body would leave the user to guess which one a
	// 413 came from, and a lower canonicalizer limit would answer 400
	// for a body that MaxRequestBytes admits.
	if o.Canonical.MaxBytes != 0 {
		bad("Options.Canonical.MaxBytes must be zero: set Options.MaxRequestBytes to bound the request body")
	}
	m.canonical = o.Canonical
	if o.MaxRequestBytes > 0 {
		// The canonicalizer has a default limit of its own, which must not
		// refuse a body that MaxRequestBytes lets in.
		m.canonical.MaxBytes = int(min(o.MaxRequestBytes, math.MaxInt))
	}
	if o.Wait < 0 {
		bad("Options.Wait %s must not be negative", o.Wait)
	}
	if o.Replay < ReplayAll || o.Replay > ReplayStatus {
		bad("Options.Replay %d is not a ReplayPolicy", o.Replay)
	}
	if o.MismatchStatus < 400 || o.MismatchStatus > 499 {
		bad("Options.MismatchStatus %d must be a 4xx status: a reused key is the client's mistake", o.MismatchStatus)
	}
	for _, st := range o.Outcomes.Release {
		m.release[st] = true
	}
	for _, st := range o.Outcomes.Unknown {
		if m.release[st] {
			bad("Options.Outcomes: status %d is in both Release and Unknown", st)
		}
		m.unknown[st] = true
	}
	for _, st := range slices.Concat(o.Outcomes.Release, o.Outcomes.Unknown) {
		if st < 200 || st > 999 {
			bad("Options.Outcomes: status %d is not a final status (200 to 999)", st)
		}
	}
	if u, err := url.Parse(o.ProblemBase); err != nil || !u.IsAbs() || strings.ContainsAny(o.ProblemBase, " <>\"") {
		bad("Options.ProblemBase %q must be an absolute URI", o.ProblemBase)
	}
	if _, err := idem.Canonicalize([]byte("{}"), m.canonical); err != nil {
		errs = append(errs, fmt.Errorf("%w: idemhttp: Options.Canonical: %w", idem.ErrInvalidOptions, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	m.do = &idem.DoOptions{Wait: o.Wait, Logger: o.Logger}
	return m, nil
}

func defaultEndpoint(r *http.Request) string {
	p := r.Pattern
	if p == "" {
		return r.Method + " " + r.URL.Path
	}
	if strings.HasPrefix(p, "/") || !strings.Contains(p, " ") {
		return r.Method + " " + p
	}
	return p
}

type ctxKey struct{}

// outcome is how the handler told the middleware to treat its response.
type outcome struct{ release, unknown, keep bool }

// Release is the handler's Lease.Release: it tells the middleware that
// the request committed nothing (it failed validation, say), so the key
// is freed and a retry runs the handler again. The response still goes to
// the client but is not stored. It wins over Keep. Calls outside the
// middleware do nothing.
func Release(r *http.Request) {
	if o, ok := r.Context().Value(ctxKey{}).(*outcome); ok {
		o.release = true
	}
}

// MarkUnknown is the handler's Lease.MarkUnknown: it tells the middleware
// that the operation may or may not have taken effect (a downstream call
// timed out after the request left), so the record becomes unknown and
// retries get 409 outcome_pending until an operator resolves it. It wins over Release and Keep. Calls outside the
// middleware do nothing.
func MarkUnknown(r *http.Request) {
	if o, ok := r.Context().Value(ctxKey{}).(*outcome); ok {
		o.unknown = true
	}
}

// Keep tells the middleware to store the response and replay it to
// retries, whatever Options.Outcomes says of its status: the handler knows
// that this answer is final. Release and MarkUnknown win over it. Calls
// outside the middleware do nothing.
func Keep(r *http.Request) {
	if o, ok := r.Context().Value(ctxKey{}).(*outcome); ok {
		o.keep = true
	}
}

// settle decides what becomes of the key once the handler answered with
// status: what the handler said first, then Options.Outcomes.
func (m *middleware) settle(out *outcome, status int) (release, unknown bool) {
	switch {
	case out.unknown:
		return false, true
	case out.release:
		return true, false
	case out.keep:
		return false, false
	}
	return m.release[status], m.unknown[status]
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !m.methods[r.Method] && (safeMethod(r.Method) || !m.hasKey(r)) {
		next.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	endpoint := m.opts.Endpoint(r)
	// Until handle returns, the handler may panic through it; the request
	// is still observed, as the panic net/http turns into a broken
	// connection.
	result, status := idem.OutcomePanic, http.StatusInternalServerError
	if m.opts.Observe != nil {
		defer func() {
			m.opts.Observe(idem.Observation{Endpoint: endpoint, Unrouted: m.pathEndpoint && r.Pattern == "",
				Outcome: result, Status: status, Duration: time.Since(start)})
		}()
	}
	result, status = m.handle(w, r, next, endpoint)
}

// safeMethod reports whether RFC 9110 defines method as safe: such a
// request changes nothing, so a key on it has nothing to protect.
func safeMethod(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// handle answers a request that needs a key and returns its result, as
// Observation names it, and the status the client got.
func (m *middleware) handle(w http.ResponseWriter, r *http.Request, next http.Handler, endpoint string) (result string, status int) {
	key, err := m.readKey(r)
	if err != nil {
		code := idem.CodeKeyInvalid
		if errors.Is(err, errKeyMissing) {
			code = idem.CodeKeyMissing
		}
		return m.problem(w, Problem{Status: http.StatusBadRequest, Code: code, Detail: err.Error()}, 0)
	}
	w.Header().Set(idem.HeaderKey, key)
	tenant, err := m.opts.Tenant(r)
	if err != nil {
		m.opts.Logger.Debug("idemhttp: Options.Tenant refused the request", "err", err)
		return m.refuse(w, idem.ErrNoTenant)
	}
	if len(tenant) > idem.MaxTenantBytes {
		// Checked here, not left to the store, so that the client hears
		// about its credential rather than about its key.
		return m.problem(w, Problem{Status: http.StatusUnauthorized, Code: idem.CodeTenantMissing,
			Detail: fmt.Sprintf("the tenant is %d bytes, more than %d", len(tenant), idem.MaxTenantBytes)}, 0)
	}
	if len(endpoint) > idem.MaxEndpointBytes {
		// By default the endpoint is the method and the path, so this is
		// the path's fault, not the key's, which is what the store's
		// ErrInvalidScope would otherwise be reported as.
		return m.problem(w, Problem{Status: http.StatusRequestURITooLong, Code: idem.CodeURITooLong,
			Detail: fmt.Sprintf("the endpoint is %d bytes, more than %d", len(endpoint), idem.MaxEndpointBytes)}, 0)
	}
	if r.ContentLength > m.opts.MaxRequestBytes {
		// Refused before a byte of the body is read, so that a client that
		// sent Expect: 100-continue gets this answer instead of the go-ahead
		// to send a body that would be refused anyway.
		return m.problem(w, Problem{Status: http.StatusRequestEntityTooLarge, Code: idem.CodePayloadTooLarge,
			Detail: fmt.Sprintf("the request body is larger than %d bytes", m.opts.MaxRequestBytes)}, 0)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.opts.MaxRequestBytes+1))
	if err != nil {
		if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
			// An outer http.MaxBytesReader has a lower cap than ours.
			return m.problem(w, Problem{Status: http.StatusRequestEntityTooLarge, Code: idem.CodePayloadTooLarge,
				Detail: fmt.Sprintf("the request body is larger than %d bytes", tooLarge.Limit)}, 0)
		}
		// The cause goes to the log only: a connection's error names both
		// ends of the socket, which the client has no use for.
		m.opts.Logger.Debug("idemhttp: reading the request body failed", "err", err)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return m.problem(w, Problem{Status: http.StatusRequestTimeout, Code: idem.CodeRequestTimeout,
				Detail: "the request body did not arrive in time; nothing was recorded, retry with the same key"}, 0)
		}
		return m.problem(w, Problem{Status: http.StatusBadRequest, Code: idem.CodeBodyInvalid,
			Detail: "the request body could not be read to its end"}, 0)
	}
	if int64(len(body)) > m.opts.MaxRequestBytes {
		return m.problem(w, Problem{Status: http.StatusRequestEntityTooLarge, Code: idem.CodePayloadTooLarge,
			Detail: fmt.Sprintf("the request body is larger than %d bytes", m.opts.MaxRequestBytes)}, 0)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	path := r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	req := idem.Request{Method: r.Method, Path: path, Tenant: tenant, ContentType: r.Header.Get("Content-Type"),
		ContentEncoding: strings.Join(r.Header.Values("Content-Encoding"), ","), Body: body}
	fp, err := req.Fingerprint(m.canonical)
	if errors.Is(err, idem.ErrInvalidBody) && m.opts.RawFallback {
		req.Raw = true
		fp, err = req.Fingerprint(m.canonical)
	}
	if err != nil {
		p := Problem{Status: http.StatusBadRequest, Code: idem.CodeBodyInvalid, Detail: err.Error()}
		var be *idem.BodyError
		if errors.As(err, &be) {
			p.BodyError, p.BodyOffset = be.Code, &be.Offset
		}
		return m.problem(w, p, 0)
	}
	scope := idem.Scope{Tenant: tenant, Endpoint: endpoint, Key: key}

	return m.execute(w, r, next, scope, fp)
}

// refuse answers a request that did not run, or whose outcome could not
// be stored, in the contract's words.
func (m *middleware) refuse(w http.ResponseWriter, err error) (result string, status int) {
	rf := idem.Refuse(err, "request")
	status = http.StatusServiceUnavailable
	switch rf.Code {
	case idem.CodeKeyReuse:
		status = m.opts.MismatchStatus
	case idem.CodeInProgress, idem.CodeOutcomePending:
		status = http.StatusConflict
	case idem.CodeKeyInvalid:
		status = http.StatusBadRequest
	case idem.CodeTenantMissing:
		status = http.StatusUnauthorized
	case idem.CodeRateLimited:
		status = http.StatusTooManyRequests
	case idem.CodeStoreFull:
		status = http.StatusInsufficientStorage
	}
	return m.problem(w, Problem{Status: status, Code: rf.Code, Detail: rf.Detail}, rf.RetryAfter)
}

// replay answers with the stored response, verbatim. A response whose
// body was not kept cannot be: sent with its status and no body, it would
// read as a successful empty answer to a client that does not know idem's
// headers. It gets 410 instead, a status no common retrying client
// repeats, since a retry would get the same answer, and whose detail says
// that the operation ran. A body in a content coding that the retry does
// not accept is decoded when it is gzip, and answered with 406 otherwise,
// rather than sent as bytes the client cannot read.
func (m *middleware) replay(w http.ResponseWriter, r *http.Request, rec *idem.Record) (result string, status int) {
	h := w.Header()
	h.Set(idem.HeaderExpires, httpDate(rec.ExpiresAt))
	if rec.BodyOmitted || rec.Response.Header[statusOnlyField] != nil {
		if m.opts.Regenerate != nil {
			if resp, ok := m.opts.Regenerate(r, rec); ok {
				again := *rec
				again.Response, again.BodyOmitted = resp, false
				again.Response.Header = resp.Header.Clone()
				delete(again.Response.Header, statusOnlyField)
				return m.replay(w, r, &again)
			}
		}
		for k, vs := range rec.Response.Header {
			// Only a status-only record's fields were chosen to go with
			// the 410; a body too large to keep left headers that
			// describe the body not sent.
			if rec.Response.Header[statusOnlyField] != nil && k != statusOnlyField && !hopByHop[k] && !strings.HasPrefix(k, "Content-") { // the 410 has a body of its own
				h[k] = slices.Clone(vs)
			}
		}
		why := fmt.Sprintf("its body (%d bytes) was too large to keep", rec.BodyLen)
		if !rec.BodyOmitted {
			why = "only its status was kept, since its answer may hold secrets"
		}
		h.Set(idem.HeaderReplayed, "true")
		h.Set(idem.HeaderBodyOmitted, "true")
		return m.problem(w, Problem{Status: http.StatusGone, Code: idem.CodeResponseBodyOmitted, OriginalStatus: rec.Response.Status,
			Detail: fmt.Sprintf("the request ran and answered %d, but %s, so it cannot be sent again; "+
				"do not repeat the operation under a new key: it would run again", rec.Response.Status, why)}, 0)
	}
	body, decoded := rec.Response.Body, false
	if c := contentCoding(rec.Response.Header); c != "" && !acceptsCoding(r.Header, c) {
		var err error
		body, err = decode(c, body, m.opts.MaxDecodedBytes)
		if errors.Is(err, errDecodedTooLarge) {
			h.Set(idem.HeaderReplayed, "true")
			return m.problem(w, Problem{Status: http.StatusNotAcceptable, Code: idem.CodeDecodedTooLarge, OriginalStatus: rec.Response.Status,
				Detail: fmt.Sprintf("the request ran and answered %d with a %s body larger than %d bytes once decoded, too large to decode "+
					"for a request whose Accept-Encoding refuses %s; retry with the same key and accept %s", rec.Response.Status, c, m.opts.MaxDecodedBytes, c, c)}, 0)
		}
		if err != nil {
			h.Set(idem.HeaderReplayed, "true")
			return m.problem(w, Problem{Status: http.StatusNotAcceptable, Code: idem.CodeEncodingNotAcceptable, OriginalStatus: rec.Response.Status,
				Detail: fmt.Sprintf("the request ran and answered %d with a body coded %s, which this request's Accept-Encoding refuses; "+
					"retry with the same key and accept %s", rec.Response.Status, c, c)}, 0)
		}
		decoded = true
	}
	for k, vs := range rec.Response.Header {
		if name, added := strings.CutPrefix(k, appendPrefix); added {
			h[name] = append(slices.Clip(h[name]), vs...)
		} else if !hopByHop[k] {
			h[k] = slices.Clone(vs)
		}
	}
	if decoded {
		// These describe the coded bytes, not the ones sent.
		h.Del("Content-Encoding")
		h.Del("Content-Length")
		h.Del("ETag")
	}
	h.Set(idem.HeaderReplayed, "true")
	w.WriteHeader(rec.Response.Status)
	w.Write(body)
	return idem.OutcomeReplayed, rec.Response.Status
}

// httpDate formats t as an RFC 9110 HTTP-date.
func httpDate(t time.Time) string { return t.UTC().Format(http.TimeFormat) }

// contentCoding returns the codings of a stored response, lower-cased and
// comma-separated, without identity: "" for a body sent as it is.
func contentCoding(h http.Header) string {
	var out []string
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				out = append(out, c)
			}
		}
	}
	return strings.Join(out, ",")
}

// acceptsCoding reports whether a request with header h accepts a body
// in content coding c, as RFC 9110 (12.5.3) reads Accept-Encoding: no
// field accepts every coding, a coding listed with weight 0 is refused,
// and "*" stands for every coding the field does not list.
func acceptsCoding(h http.Header, c string) bool {
	vs, ok := h["Accept-Encoding"]
	if !ok {
		return true
	}
	c = strings.TrimPrefix(c, "x-")
	star := false
	for v := range strings.SplitSeq(strings.Join(vs, ","), ",") {
		name, params, _ := strings.Cut(v, ";")
		name = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(name)), "x-")
		switch name {
		case c:
			return weight(params) > 0
		case "*":
			star = weight(params) > 0
		}
	}
	return star
}

// weight returns the q parameter among an Accept-Encoding member's
// parameters, 1 when it has none or an unreadable one.
func weight(params string) float64 {
	for p := range strings.SplitSeq(params, ";") {
		name, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(strings.TrimSpace(name), "q") {
			if q, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return q
			}
		}
	}
	return 1
}

// errDecodedTooLarge is decode's refusal of a body that inflates beyond
// its limit.
var errDecodedTooLarge = errors.New("idemhttp: the decoded body is too large")

// decode undoes content coding c, which must be gzip alone: the coding
// that servers use most and the only one the standard library reads. It
// stops reading past limit bytes of output.
func decode(c string, body []byte, limit int64) ([]byte, error) {
	if c != "gzip" && c != "x-gzip" {
		return nil, fmt.Errorf("idemhttp: cannot decode %s", c)
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err == nil && int64(len(out)) > limit {
		err = errDecodedTooLarge
	}
	return out, err
}

// The operation's errors that tell idem.Do to record the outcome as
// unknown.
var (
	errUnknown  = errors.New("idemhttp: the handler marked the outcome unknown")
	errHijacked = errors.New("idemhttp: the handler took over the connection")
)

// statusOnlyField marks, in a stored header, an answer of which only the
// status was kept. A real field's name has no colon, so none collides.
const statusOnlyField = "Status-Only:"

// statusOnly reports whether Options.Replay keeps only the status of an
// answer with header h.
func (m *middleware) statusOnly(h http.Header) bool {
	switch m.opts.Replay {
	case ReplayStatus:
		return true
	case ReplayPublic:
		for _, v := range h.Values("Cache-Control") {
			for d := range strings.SplitSeq(v, ",") {
				name, _, _ := strings.Cut(strings.TrimSpace(d), "=")
				if strings.EqualFold(name, "no-store") || strings.EqualFold(name, "private") {
					return true
				}
			}
		}
	}
	return false
}

// ErrReplayForbidden is the error Options.AuthorizeReplay returns for a
// caller that may not have the stored answer.
var ErrReplayForbidden = errors.New("idemhttp: the caller may not have the stored answer")

// replayCheckRetry is the Retry-After of replay_check_failed.
const replayCheckRetry = time.Second

// execute runs the handler through idem.Do, which claims the key and
// stores the outcome, and only then lets the response reach the client: a
// client must never hold an answer that a crash could still take back
// from its retries. A handler that flushes streams instead (see recorder).
func (m *middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, scope idem.Scope, fp idem.Fingerprint) (result string, status int) {
	out := &outcome{}
	// A client that disconnects must not cancel the operation: its retry
	// should find the finished result, not a half-done one.
	hctx := context.WithValue(context.WithoutCancel(r.Context()), ctxKey{}, out)
	var rec *recorder
	res, err := idem.Do(r.Context(), m.opts.Store, scope, fp, m.do, func(_ context.Context, lease idem.Lease) (idem.Response, error) {
		rec = &recorder{w: w, outer: w.Header().Clone(), h2: r.ProtoMajor >= 2, expires: httpDate(lease.Record().ExpiresAt)}
		// What a handler that panics wrote is never sent: net/http breaks
		// the connection.
		next.ServeHTTP(rec, r.WithContext(hctx))
		status, header, body := rec.response()
		release, unknown := m.settle(out, status)
		switch {
		case rec.hijacked:
			return idem.Response{}, errHijacked
		case unknown:
			return idem.Response{}, errUnknown
		case release:
			return idem.Response{}, idem.ErrNoEffect
		}
		for _, name := range m.unstored {
			delete(header, name)
			delete(header, appendPrefix+name)
		}
		if m.statusOnly(header) {
			kept := http.Header{statusOnlyField: {"true"}}
			for _, name := range m.kept {
				if vs, ok := header[name]; ok {
					kept[name] = vs
				}
			}
			return idem.Response{Status: status, Header: kept}, nil
		}
		return idem.Response{Status: status, Header: header, Body: body}, nil
	})
	switch {
	case res.Replayed != nil:
		if m.opts.AuthorizeReplay != nil {
			if err := m.opts.AuthorizeReplay(r); errors.Is(err, ErrReplayForbidden) {
				return m.problem(w, Problem{Status: http.StatusForbidden, Code: idem.CodeReplayForbidden,
					Detail: "the request ran, but these credentials may not have its answer again; renew them and retry with the same key"}, 0)
			} else if err != nil {
				m.opts.Logger.Warn("idemhttp: the check before a replay failed", "err", err)
				return m.problem(w, Problem{Status: http.StatusServiceUnavailable, Code: idem.CodeReplayCheckFailed,
					Detail: "the request ran, but its answer is sent again only once the credentials are checked, and the check failed; retry with the same key"}, replayCheckRetry)
			}
		}
		return m.replay(w, r, res.Replayed)
	case rec == nil:
		return m.refuse(w, err)
	case errors.Is(err, errHijacked):
		return idem.OutcomeHijacked, 0
	case errors.Is(err, idem.ErrOutcomeNotStored) && rec.streaming:
		// Most of a streamed answer is out, but not its end: breaking the
		// connection now tells the client it does not have it.
		panic(http.ErrAbortHandler)
	case errors.Is(err, idem.ErrOutcomeNotStored):
		// The retry gets 409 until the record is reconciled; it never runs
		// the operation again.
		key := w.Header().Get(idem.HeaderKey)
		clear(w.Header())
		w.Header().Set(idem.HeaderKey, key)
		return m.refuse(w, err)
	case err == nil:
		rec.setHeader(idem.HeaderExpires, rec.expires)
	}
	return idem.OutcomeExecuted, rec.send()
}
