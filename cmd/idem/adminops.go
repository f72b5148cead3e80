package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
)

// The operator routes: what inspect, get, stats and resolve do (and check
// and compact, in adminmaint.go), served on the admin listener of a
// running proxy, so that stuck keys can be settled without
// stopping it. Every route needs the admin token as a
// bearer token; without a configured token none is served.
//
//	GET  /v1/admin/records   records as JSON lines, without their responses;
//	                         query: tenant, endpoint, state,
//	                         created_before (RFC 3339), expired=true
//	POST /v1/admin/record    one record in full; body: {tenant, endpoint, key}
//	GET  /v1/admin/overdue   in-progress records past their lease; query: limit
//	GET  /v1/admin/metrics   the store's metrics as JSON
//	POST /v1/admin/resolve   settle a stuck record; body: resolveRequest
//	POST /v1/admin/compact   and GET /v1/admin/check: see adminmaint.go
//
// Keys travel in request bodies, never in URLs, which access logs keep.

// The environment variables that hold the admin listener's tokens when
// no file is given. A token on the command line would be in the process
// list for every user of the machine to read.
const (
	adminTokenEnv     = "IDEM_ADMIN_TOKEN"
	adminReadTokenEnv = "IDEM_ADMIN_READ_TOKEN"
	metricsTokenEnv   = "IDEM_METRICS_TOKEN"
)

// minAdminToken is the shortest admin token accepted: idem keygen --format
// token prints longer ones.
const minAdminToken = 16

// adminTokenHelp is --admin-token-file's help.
const adminTokenHelp = "file holding the admin token, which every operator route on the admin listener accepts as a bearer token (default: the " + adminTokenEnv + " environment variable)"

// tokenSource is a token flag: a file, or else an environment variable.
type tokenSource struct {
	flag, env string
	file      *string
}

func tokenFlag(fs *flag.FlagSet, name, env, help string) *tokenSource {
	return &tokenSource{flag: name, env: env, file: fs.String(name, "", help)}
}

func adminTokenFlag(fs *flag.FlagSet) *tokenSource {
	return tokenFlag(fs, "admin-token-file", adminTokenEnv, adminTokenHelp)
}

// read returns the token, "" when none is configured. A file that other
// users may read is reported on stderr: whoever reads it holds the token.
func (t *tokenSource) read(stderr io.Writer) (string, error) {
	tok := os.Getenv(t.env)
	if *t.file != "" {
		b, err := os.ReadFile(*t.file)
		if err != nil {
			return "", fmt.Errorf("--%s: %w", t.flag, err)
		}
		if st, err := os.Stat(*t.file); err == nil && st.Mode().Perm()&0o077 != 0 {
			fmt.Fprintf(stderr, "idem: warning: the file of --%s can be read by other users (mode %s); chmod 600 it\n", t.flag, st.Mode().Perm())
		}
		tok = string(b)
	}
	tok = strings.TrimSpace(tok)
	if tok != "" && len(tok) < minAdminToken {
		return "", fmt.Errorf("the token of --%s is %d characters; it needs at least %d (idem keygen --format token makes one)", t.flag, len(tok), minAdminToken)
	}
	return tok, nil
}

// adminFlags configure the proxy's admin listener: its tokens, the Host
// names it answers besides addresses and localhost, and its TLS.
type adminFlags struct {
	write, read, metrics *tokenSource
	hosts                *string
	tls                  *tlsFlags
	clientCA             *string
}

func addAdminFlags(fs *flag.FlagSet) *adminFlags {
	return &adminFlags{
		write: adminTokenFlag(fs),
		read: tokenFlag(fs, "admin-read-token-file", adminReadTokenEnv,
			"file holding a token that the operator routes which only read (inspect, get, stats, check) accept, and resolve and compact do not (default: the "+adminReadTokenEnv+" environment variable)"),
		metrics: tokenFlag(fs, "metrics-token-file", metricsTokenEnv,
			"file holding a token that GET /metrics then requires as a bearer token, as the read and admin tokens do (default: the "+metricsTokenEnv+" environment variable; none: /metrics is open to whoever reaches the listener)"),
		hosts:    fs.String("admin-hosts", "", "comma-separated host names the admin listener answers for besides IP addresses and localhost; a request for another Host gets 421, which stops a web page whose name was pointed at the listener (DNS rebinding)"),
		tls:      addTLSFlags(fs, "admin-", "admin listener"),
		clientCA: fs.String("admin-client-ca", "", "PEM `FILE` of the certificate authorities whose client certificates the admin listener requires; needs --admin-tls-cert"),
	}
}

// load reads the tokens and the TLS files: the guard the admin routes go
// behind, and the listener's TLS configuration (nil for plain HTTP).
func (f *adminFlags) load(stderr io.Writer) (*adminGuard, *tls.Config, error) {
	g := &adminGuard{hosts: map[string]bool{}}
	for _, t := range []struct {
		src *tokenSource
		dst **[sha256.Size]byte
	}{{f.write, &g.write}, {f.read, &g.read}, {f.metrics, &g.metrics}} {
		tok, err := t.src.read(stderr)
		if err != nil {
			return nil, nil, err
		}
		*t.dst = hashToken(tok)
	}
	for h := range strings.SplitSeq(*f.hosts, ",") {
		if h = strings.ToLower(strings.TrimSpace(h)); h != "" {
			g.hosts[h] = true
		}
	}
	conf, err := f.tls.config(stderr)
	if err != nil || *f.clientCA == "" {
		return g, conf, err
	}
	if conf == nil {
		return nil, nil, errors.New("--admin-client-ca needs --admin-tls-cert and --admin-tls-key")
	}
	pem, err := os.ReadFile(*f.clientCA)
	if err != nil {
		return nil, nil, fmt.Errorf("--admin-client-ca: %w", err)
	}
	conf.ClientCAs = x509.NewCertPool()
	if !conf.ClientCAs.AppendCertsFromPEM(pem) {
		return nil, nil, errors.New("--admin-client-ca: no PEM certificate in the file")
	}
	conf.ClientAuth = tls.RequireAndVerifyClientCert
	return g, conf, nil
}

// adminGuard is who the admin listener answers: the Host names it serves
// and the tokens of each kind of route. A token's hash is kept, so that
// ConstantTimeCompare gets inputs of one length and says nothing about
// the token's length either.
type adminGuard struct {
	write, read, metrics *[sha256.Size]byte // nil: not configured
	hosts                map[string]bool
}

func hashToken(tok string) *[sha256.Size]byte {
	if tok == "" {
		return nil
	}
	sum := sha256.Sum256([]byte(tok))
	return &sum
}

// hostAllowed reports whether a request for host may be answered: an IP
// address, localhost, or a name --admin-hosts lists. A page that an
// attacker's name points at this listener (DNS rebinding) arrives with
// that name, which is none of these.
func (g *adminGuard) hostAllowed(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	return net.ParseIP(host) != nil || host == "localhost" || g.hosts[host]
}

// guard answers 421 for a Host the listener does not serve, and passes
// the rest to h.
func (g *adminGuard) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.hostAllowed(r.Host) {
			adminProblem(w, http.StatusMisdirectedRequest, codeHostNotAllowed,
				"the admin listener does not answer for this Host; use its address, or list the name in --admin-hosts", 0)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// authorized reports whether r carries one of tokens as a bearer token.
// The scheme's name is matched without regard to case (RFC 9110).
func authorized(r *http.Request, tokens ...*[sha256.Size]byte) bool {
	scheme, got, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
	ok := 0
	for _, want := range tokens {
		if want != nil {
			ok |= subtle.ConstantTimeCompare(sum[:], want[:])
		}
	}
	return ok == 1
}

// behind wraps h so that it answers only requests with one of tokens.
func behind(h http.Handler, what string, tokens ...*[sha256.Size]byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !authorized(r, tokens...) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem admin"`)
			adminProblem(w, http.StatusUnauthorized, codeUnauthorized, what+" need a token: Authorization: Bearer <token>", 0)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// registerOps adds the operator routes to mux: those that only read take
// the read or the admin token, those that change records (resolve,
// compact) the admin token alone. With neither token it adds none, so
// they answer 404 like any unknown path. It logs which, so that an
// operator who expects them learns why they 404.
func (a *admin) registerOps(mux *http.ServeMux, g *adminGuard) {
	if g.write == nil && g.read == nil {
		a.log.Info("idem: operator routes off: no admin token (--admin-token-file or " + adminTokenEnv + ")")
		return
	}
	read := func(h http.HandlerFunc) http.Handler { return behind(h, "the operator routes", g.write, g.read) }
	mux.Handle("GET /v1/admin/records", read(a.records))
	mux.Handle("POST /v1/admin/record", read(a.record))
	mux.Handle("GET /v1/admin/overdue", read(a.overdue))
	mux.Handle("GET /v1/admin/metrics", read(a.metrics))
	mux.Handle("GET /v1/admin/check", read(a.check))
	if g.write == nil {
		a.log.Info("idem: operator routes on under /v1/admin/ for reading only: a read token and no admin token")
		return
	}
	a.log.Info("idem: operator routes on under /v1/admin/, with the admin token as bearer token")
	write := func(h http.HandlerFunc) http.Handler {
		return behind(h, "the operator routes that change records", g.write)
	}
	mux.Handle("POST /v1/admin/resolve", write(a.resolve))
	mux.Handle("POST /v1/admin/compact", write(a.compact))
}

// Codes of the operator routes' problem documents, beside the contract's
// request_in_progress and store_unavailable.
const (
	codeUnauthorized   = "unauthorized"     // 401: no token, or not one the route takes
	codeHostNotAllowed = "host_not_allowed" // 421: a Host the admin listener does not serve
	codeBadRequest     = "bad_request"      // 400: the request is malformed; nothing changed
	codeNotFound       = "record_not_found" // 404: no live record for the scope
	codeCompleted      = "record_completed" // 409: a completed record is never overwritten
)

func adminProblem(w http.ResponseWriter, status int, code, detail string, retry time.Duration) {
	idemhttp.WriteProblem(w, idemhttp.Problem{Status: status, Code: code, Detail: detail}, retry)
}

// storeFailed answers a store error the routes have no better answer for;
// the error, which may name files or hosts, goes to the log only.
func (a *admin) storeFailed(w http.ResponseWriter, route string, err error) {
	a.log.Error("idem: operator route failed", "route", route, "err", err)
	adminProblem(w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable, "the store could not be read or written; see the server's log", 0)
}

// wireRecord is a record on the operator routes: the tools' JSON view,
// key included since the caller holds the admin token, and the body as
// base64 so that bytes that are not UTF-8 survive.
type wireRecord struct {
	recordView
	Raw []byte `json:"body_base64,omitempty"`
}

// recordLine is one line of GET /v1/admin/records: a record, or only an
// error member when the listing broke off after its status was sent.
type recordLine struct {
	wireRecord
	Error string `json:"error,omitempty"`
}

// wireOf shows rec; body says whether with its response's header and
// body, which listings leave out to stay small.
func wireOf(rec *idem.Record, body bool, now time.Time) *wireRecord {
	w := &wireRecord{recordView: viewOf(rec, true, now)}
	if body && rec.State == idem.StateCompleted {
		w.Header, w.Raw = rec.Response.Header, rec.Response.Body
	}
	return w
}

// record turns w back into the record it shows.
func (w *wireRecord) record() (*idem.Record, error) {
	st, err := idem.ParseState(w.State)
	if err != nil {
		return nil, err
	}
	rec := &idem.Record{
		Scope: idem.Scope{Tenant: w.Tenant, Endpoint: w.Endpoint, Key: w.Key}, State: st,
		Response:    idem.Response{Status: w.Status, Header: w.Header, Body: w.Raw},
		BodyOmitted: w.BodyOmitted, BodyLen: w.BodyBytes,
		CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt, ExpiresAt: w.ExpiresAt, LeaseUntil: w.LeaseUntil, Attempts: w.Attempts,
	}
	if err := decodeHex(rec.Fingerprint[:], w.Fingerprint); err != nil {
		return nil, fmt.Errorf("fingerprint: %w", err)
	}
	if err := decodeHex(rec.BodyDigest[:], w.BodySHA256); err != nil {
		return nil, fmt.Errorf("body_sha256: %w", err)
	}
	return rec, nil
}

func decodeHex(dst []byte, s string) error {
	if n, err := hex.Decode(dst, []byte(s)); err != nil || n != len(dst) {
		return fmt.Errorf("want %d hex-encoded bytes", len(dst))
	}
	return nil
}

func (a *admin) records(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := idem.Filter{Tenant: q.Get("tenant"), Endpoint: q.Get("endpoint")}
	var errs []string
	var err error
	if f.State, err = parseStateFlag(q.Get("state")); err != nil {
		errs = append(errs, "state: want in_progress, completed, failed or unknown")
	}
	if s := q.Get("created_before"); s != "" {
		if f.CreatedBefore, err = time.Parse(time.RFC3339Nano, s); err != nil {
			errs = append(errs, "created_before: want an RFC 3339 time")
		}
	}
	if s := q.Get("expired"); s != "" {
		if f.Expired, err = strconv.ParseBool(s); err != nil {
			errs = append(errs, "expired: want true or false")
		}
	}
	if len(errs) > 0 {
		adminProblem(w, http.StatusBadRequest, codeBadRequest, strings.Join(errs, "; "), 0)
		return
	}
	now := time.Now()
	enc := json.NewEncoder(w)
	started := false
	for rec, err := range a.db.Records(r.Context(), f) {
		if err != nil && !started {
			a.storeFailed(w, "records", err)
			return
		}
		if !started {
			w.Header().Set("Content-Type", "application/jsonl")
			w.Header().Set("Cache-Control", "no-store")
			started = true
		}
		if err != nil {
			a.log.Error("idem: operator route failed", "route", "records", "err", err)
			enc.Encode(map[string]string{"error": "the listing broke off: the store could not be read; see the server's log"})
			return
		}
		if enc.Encode(wireOf(rec, false, now)) != nil {
			return // the caller went away
		}
	}
	if !started {
		w.Header().Set("Content-Type", "application/jsonl")
		w.Header().Set("Cache-Control", "no-store")
	}
}

// readRequest reads r's JSON body into v, refusing unknown members, and
// answers 400 when it fails.
func readRequest(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	// A misspelt member would otherwise be dropped without a word.
	dec.DisallowUnknownFields()
	detail := ""
	if err := dec.Decode(v); err != nil {
		detail = "the body is not the JSON object expected: " + err.Error()
	} else if dec.More() {
		detail = "the body has data after its JSON object"
	}
	if detail != "" {
		adminProblem(w, http.StatusBadRequest, codeBadRequest, detail, 0)
		return false
	}
	return true
}

// maxAdminBody bounds a request body on the operator routes: a resolve
// carries at most a stored response body, 4 MiB by default, in base64.
const maxAdminBody = 64 << 20

// scopeRequest names one record.
type scopeRequest struct {
	Tenant   string `json:"tenant"`
	Endpoint string `json:"endpoint"`
	Key      string `json:"key"`
}

func (s scopeRequest) scope() idem.Scope {
	return idem.Scope{Tenant: s.Tenant, Endpoint: s.Endpoint, Key: s.Key}
}

// checkScopeRequest answers 400 for a scope the tools would refuse.
func checkScopeRequest(w http.ResponseWriter, s idem.Scope) bool {
	if s.Endpoint == "" || s.Key == "" {
		adminProblem(w, http.StatusBadRequest, codeBadRequest, "endpoint and key are required", 0)
		return false
	}
	if err := s.Validate(); err != nil {
		adminProblem(w, http.StatusBadRequest, codeBadRequest, err.Error(), 0)
		return false
	}
	return true
}

func (a *admin) record(w http.ResponseWriter, r *http.Request) {
	var req scopeRequest
	if !readRequest(w, r, &req) || !checkScopeRequest(w, req.scope()) {
		return
	}
	rec, err := a.db.Get(r.Context(), req.scope())
	if err != nil {
		a.recordFailed(w, "record", req.scope(), err)
		return
	}
	writeAdminJSON(w, wireOf(rec, true, time.Now()))
}

// recordFailed answers an error about the record at s.
func (a *admin) recordFailed(w http.ResponseWriter, route string, s idem.Scope, err error) {
	var ke *idem.KeyError
	switch {
	case errors.Is(err, idem.ErrNotFound):
		adminProblem(w, http.StatusNotFound, codeNotFound, "no live record for key hash "+idem.KeyHash(s.Key)+": it never existed, was released, or expired", 0)
	case errors.Is(err, idem.ErrCompleted):
		adminProblem(w, http.StatusConflict, codeCompleted, "the record is completed; its response is what every retry replays and is never overwritten", 0)
	case errors.As(err, &ke) && errors.Is(err, idem.ErrInProgress):
		adminProblem(w, http.StatusConflict, idem.CodeInProgress, "the record is in progress and its lease runs for another "+age(ke.RetryAfter)+
			"; the process that claimed it may still finish it", ke.RetryAfter)
	case errors.Is(err, idem.ErrInvalidScope), errors.Is(err, idem.ErrInvalidResponse):
		adminProblem(w, http.StatusBadRequest, codeBadRequest, err.Error(), 0)
	default:
		a.storeFailed(w, route, err)
	}
}

func (a *admin) overdue(w http.ResponseWriter, r *http.Request) {
	limit := 0
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			adminProblem(w, http.StatusBadRequest, codeBadRequest, "limit: want a number, 0 or more", 0)
			return
		}
		limit = n
	}
	recs, err := a.db.Overdue(r.Context(), limit)
	if err != nil {
		a.storeFailed(w, "overdue", err)
		return
	}
	now := time.Now()
	out := make([]*wireRecord, len(recs))
	for i, rec := range recs {
		out[i] = wireOf(rec, false, now)
	}
	writeAdminJSON(w, out)
}

func (a *admin) metrics(w http.ResponseWriter, r *http.Request) {
	m, err := a.db.Metrics(r.Context())
	if err != nil {
		a.storeFailed(w, "metrics", err)
		return
	}
	writeAdminJSON(w, m)
}

// resolveRequest is POST /v1/admin/resolve's body: idem resolve's flags.
type resolveRequest struct {
	scopeRequest
	As     string              `json:"as"`
	Status int                 `json:"status,omitempty"`
	Header map[string][]string `json:"header,omitempty"`
	Body   []byte              `json:"body_base64,omitempty"`
	Reason string              `json:"reason,omitempty"`
}

// resolveResult is what POST /v1/admin/resolve answers: the record as it
// was before.
type resolveResult struct {
	KeyHash  string `json:"key_hash"`
	From     string `json:"from"`
	As       string `json:"as"`
	Attempts uint32 `json:"attempts"`
}

func (a *admin) resolve(w http.ResponseWriter, r *http.Request) {
	var req resolveRequest
	if !readRequest(w, r, &req) || !checkScopeRequest(w, req.scope()) {
		return
	}
	// The header passes resolve's --header check, so that a replay never
	// sends a name or value that could end the header early.
	header := headerFlags{}
	for name, values := range req.Header {
		for _, v := range values {
			if err := header.Set(name + ": " + v); err != nil || strings.Contains(name, ":") {
				adminProblem(w, http.StatusBadRequest, codeBadRequest, fmt.Sprintf("header %q: want a field name without spaces or colons, and values on one line", name), 0)
				return
			}
		}
	}
	res := resolution{As: req.As, Response: idem.Response{Status: req.Status, Header: http.Header(header), Body: req.Body}, Reason: req.Reason}
	if err := res.check(false); err != nil {
		adminProblem(w, http.StatusBadRequest, codeBadRequest, err.Error(), 0)
		return
	}
	// The operator's request ends when the tool gives up; the resolution,
	// once started, is worth finishing.
	prev, err := settle(context.WithoutCancel(r.Context()), a.db, req.scope(), res)
	if err != nil {
		a.recordFailed(w, "resolve", req.scope(), err)
		return
	}
	logResolution(a.log, req.scope(), prev, res, "admin")
	writeAdminJSON(w, resolveResult{KeyHash: idem.KeyHash(req.Key), From: prev.State.String(), As: res.As, Attempts: prev.Attempts})
}

// writeAdminJSON answers v, which no cache may keep.
func writeAdminJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, v)
}

// discard drains and closes a response body so that its connection is
// reused.
func discard(body io.ReadCloser) {
	io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	body.Close()
}
