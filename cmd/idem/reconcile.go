package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
)

// The proxy's reconciler: with --reconcile-url, the store hands it every
// claim whose lease ran out (the proxy died, or could not store the
// answer), and it asks the upstream what became of the operation. The
// rules below are the ones docs/proxy.md and the proxy's help promise.

// headerOriginalStatus lets a lookup that answers 2xx give the original
// response's status when it differs from its own.
const headerOriginalStatus = "Idempotency-Original-Status"

// lookupUserAgent names the reconciler's requests in the upstream's logs.
const lookupUserAgent = "idem-proxy-reconciler"

// defaultReconcileAttempts is --reconcile-attempts' default: with a pass
// a minute, about ten minutes of an upstream that cannot say.
const defaultReconcileAttempts = 10

const reconcileURLHelp = "`URL` the proxy asks, for each claim whose lease ran out (the proxy stopped, or could not store the answer), " +
	"what became of its operation: a GET carrying the claim in the " + idem.HeaderKey + ", " + headerLookupTenant + " and " + headerLookupEndpoint + " headers, never in the URL. " +
	"A 2xx answer is the operation's response and is stored for replays (its status, or the one in " + headerOriginalStatus + "), " +
	"404 means the operation never took effect and frees the key, anything else is asked again a minute later. " +
	"The proxy refuses to forward clients to this path (default none: such claims wait for an operator)"

const reconcileAttemptsHelp = "how many lookups of one claim may go unanswered (an error, or a status other than 2xx and 404) " +
	"before its outcome is recorded unknown, for an operator to resolve; 0 asks until the key expires"

const reconcileTokenHelp = "file holding the token each lookup sends as Authorization: Bearer, for the upstream to tell the proxy's lookups " +
	"from a client's (default: the " + reconcileTokenEnv + " environment variable)"

// reconcileTokenEnv holds the lookup's token when no file is given.
const reconcileTokenEnv = "IDEM_RECONCILE_TOKEN"

// The headers that carry a lookup's claim beside idem.HeaderKey. A URL is
// written to access logs along the way; a header is not.
const (
	headerLookupTenant   = "Idempotency-Tenant"
	headerLookupEndpoint = "Idempotency-Endpoint"
)

// reconcileFlags are --reconcile-url, --reconcile-attempts and
// --reconcile-token-file.
type reconcileFlags struct {
	url      string
	attempts int
	token    *tokenSource
}

func addReconcileFlags(fs *flag.FlagSet) *reconcileFlags {
	f := &reconcileFlags{}
	fs.StringVar(&f.url, "reconcile-url", "", reconcileURLHelp)
	fs.IntVar(&f.attempts, "reconcile-attempts", defaultReconcileAttempts, reconcileAttemptsHelp)
	f.token = tokenFlag(fs, "reconcile-token-file", reconcileTokenEnv, reconcileTokenHelp)
	return f
}

// reconciler returns the reconciler the flags describe, or nil when there
// is no --reconcile-url. Each lookup may take timeout, and an answer
// larger than maxBody is not stored.
func (f *reconcileFlags) reconciler(timeout time.Duration, maxBody int64, log *slog.Logger, stderr io.Writer) (*reconciler, error) {
	if f.url == "" {
		return nil, nil
	}
	u, err := parseLookupURL(f.url)
	if err != nil {
		return nil, fmt.Errorf("--reconcile-url: %v", err)
	}
	if f.attempts < 0 {
		return nil, fmt.Errorf("--reconcile-attempts %d must not be negative", f.attempts)
	}
	token, err := f.token.read(stderr)
	if err != nil {
		return nil, err
	}
	if token == "" {
		log.Warn("idem proxy: the reconciler's lookups carry no credential; give the upstream one to check with --reconcile-token-file")
	}
	rc := newReconciler(u, timeout, maxBody, f.attempts, log)
	rc.token = token
	return rc, nil
}

// parseLookupURL checks s: an http or https URL with a host, and no user
// information, fragment or braces, which once held the claim.
func parseLookupURL(s string) (*url.URL, error) {
	if strings.ContainsAny(s, "{}") {
		return nil, fmt.Errorf("%q: the lookup's URL is fixed; the claim travels in the %s, %s and %s headers", s, idem.HeaderKey, headerLookupTenant, headerLookupEndpoint)
	}
	return parseAskURL(s)
}

// parseAskURL checks s, a URL the proxy asks the upstream at on its own
// (a lookup, an auth check): http or https, with a host, and no user
// information or fragment.
func parseAskURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" || strings.Contains(s, "#") {
		return nil, fmt.Errorf("%q must be an http:// or https:// URL with a host, and no user or fragment", s)
	}
	return u, nil
}

// askClient is the client of the proxy's own requests to the upstream. It
// follows no redirect: a login page it led to would pass for an answer.
func askClient() *http.Client {
	return &http.Client{
		Transport:     upstreamTransport(),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// reservedPath returns the path on target that clients must not reach
// through the proxy, the lookup's, or "" when the lookup goes elsewhere.
func (rc *reconciler) reservedPath(target *url.URL) string {
	if rc == nil || !strings.EqualFold(rc.url.Scheme, target.Scheme) || !strings.EqualFold(hostPort(rc.url), hostPort(target)) {
		return ""
	}
	return cleanPath(rc.url.Path)
}

// hostPort is u's host and port, the scheme's default port spelt out.
func hostPort(u *url.URL) string {
	if port := u.Port(); port != "" {
		return net.JoinHostPort(u.Hostname(), port)
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// cleanPath is p as most routers match it: rooted, without dot segments,
// doubled slashes or a trailing slash.
func cleanPath(p string) string { return path.Clean("/" + p) }

// refuseReserved answers 403 path_reserved for a request whose path on the
// upstream is reserved or lies below it, matched without regard to case
// for the routers that ignore it, and passes the others to h. The
// upstream's check of the lookup's token stays the real protection.
func refuseReserved(reserved string, target *url.URL, problemBase string, h http.Handler) http.Handler {
	if reserved == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := cleanPath(target.JoinPath(r.URL.Path).Path)
		if strings.EqualFold(p, reserved) || (len(p) > len(reserved) && strings.EqualFold(p[:len(reserved)], reserved) && p[len(reserved)] == '/') {
			writeProblem(w, idemhttp.Problem{Type: problemBase + codePathReserved, Status: http.StatusForbidden, Code: codePathReserved,
				Detail: "this path on the upstream is kept for the proxy's own requests and is not forwarded"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// reconciler asks the upstream what became of overdue claims; its
// Reconcile is the store's Options.Reconcile.
type reconciler struct {
	url      *url.URL
	token    string // sent as a bearer token when set
	client   *http.Client
	timeout  time.Duration
	maxBody  int64
	attempts int      // unanswered lookups before the outcome is recorded unknown; 0: no bound
	unstored []string // response fields a stored answer never keeps, as --unstored-headers says
	log      *slog.Logger
}

func newReconciler(u *url.URL, timeout time.Duration, maxBody int64, attempts int, log *slog.Logger) *reconciler {
	return &reconciler{
		url: u, client: askClient(),
		timeout: timeout, maxBody: maxBody, attempts: attempts, log: log,
	}
}

// reconcileFunc returns rc.Reconcile for a store's options, or nil without
// a reconciler.
func (rc *reconciler) reconcileFunc() func(context.Context, idem.Lease) error {
	if rc == nil {
		return nil
	}
	return rc.Reconcile
}

// A verdict is what a lookup says of an operation.
type verdict int

const (
	undecided      verdict = iota // no answer: ask again on the next pass
	found                         // it ran; here is its response
	notFound                      // it never took effect
	unknownOutcome                // the upstream cannot tell, and never will
)

// Reconcile settles l as the upstream's lookup says. A lookup that does
// not answer leaves the record in progress, and the error, which the
// store logs, says why; the store hands the record over again once the
// fresh lease it took runs out. After rc.attempts such lookups the outcome
// is recorded unknown, counted by the record's attempts after its first,
// so that the count survives restarts and is shared by replicas.
func (rc *reconciler) Reconcile(ctx context.Context, l idem.Lease) error {
	sc := l.Scope()
	v, resp, err := rc.lookup(ctx, sc)
	logged := []any{"tenant", sc.Tenant, "endpoint", sc.Endpoint, "key_hash", idem.KeyHash(sc.Key)}
	switch v {
	case found:
		rc.log.Info("idem proxy: the upstream's lookup found the operation; its answer is stored for replays", append(logged, "status", resp.Status)...)
		return l.Complete(ctx, resp)
	case notFound:
		rc.log.Info("idem proxy: the upstream's lookup says the operation never took effect; the key is free", logged...)
		return l.Release(ctx)
	case unknownOutcome:
		rc.log.Warn("idem proxy: the upstream's lookup cannot tell what became of the operation; its outcome is recorded unknown", logged...)
		return l.MarkUnknown(ctx)
	}
	lookups := max(int(l.Record().Attempts)-1, 1)
	if ctx.Err() != nil || rc.attempts == 0 || lookups < rc.attempts {
		return err
	}
	rc.log.Warn("idem proxy: the upstream's lookup went unanswered too often; the outcome is recorded unknown, for an operator to resolve",
		append(logged, "lookups", lookups, "err", err)...)
	if merr := l.MarkUnknown(ctx); merr != nil {
		return errors.Join(err, merr)
	}
	return nil
}

// lookup asks the upstream about the operation at sc. Its errors never
// hold the lookup's URL, which may hold a secret of its own in its query.
func (rc *reconciler) lookup(ctx context.Context, sc idem.Scope) (verdict, idem.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, rc.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rc.url.String(), nil)
	if err != nil {
		return undecided, idem.Response{}, errors.New("lookup: --reconcile-url does not make a request")
	}
	req.Header.Set("User-Agent", lookupUserAgent)
	req.Header.Set(idem.HeaderKey, sc.Key)
	req.Header.Set(headerLookupTenant, sc.Tenant)
	req.Header.Set(headerLookupEndpoint, sc.Endpoint)
	if rc.token != "" {
		req.Header.Set("Authorization", "Bearer "+rc.token)
	}
	resp, err := rc.client.Do(req)
	if err != nil {
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return undecided, idem.Response{}, fmt.Errorf("lookup: no answer within %s", rc.timeout)
		}
		return undecided, idem.Response{}, fmt.Errorf("lookup: %w", err)
	}
	defer discard(resp.Body)
	if strings.EqualFold(strings.TrimSpace(resp.Header.Get(idem.HeaderOutcome)), "unknown") {
		return unknownOutcome, idem.Response{}, nil
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return notFound, idem.Response{}, nil
	case resp.StatusCode/100 != 2:
		return undecided, idem.Response{}, fmt.Errorf("lookup: the upstream answered %s, neither 2xx (found) nor 404 (not found)", resp.Status)
	}
	status := resp.StatusCode
	if v := resp.Header.Get(headerOriginalStatus); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 200 || n > 999 {
			return undecided, idem.Response{}, fmt.Errorf("lookup: %s %q is not a final status (200-999)", headerOriginalStatus, v)
		}
		status = n
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, rc.maxBody+1))
	if err != nil {
		return undecided, idem.Response{}, fmt.Errorf("lookup: reading the answer: %w", err)
	}
	if int64(len(body)) > rc.maxBody {
		return undecided, idem.Response{}, fmt.Errorf("lookup: the answer's body is over --max-stored-body (%d bytes), so it cannot be stored", rc.maxBody)
	}
	header := lookupHeader(resp.Header)
	for _, name := range rc.unstored {
		header.Del(name)
	}
	return found, idem.Response{Status: status, Header: header, Body: body}, nil
}

// lookupHeader is the part of a lookup's header that a replay sends: not
// the fields of its own connection, which a replay sets anew, nor the
// contract's and the lookup's own fields.
func lookupHeader(h http.Header) http.Header {
	out := h.Clone()
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			out.Del(textproto.TrimString(name))
		}
	}
	for _, name := range []string{
		"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
		"Date", "Content-Length",
		idem.HeaderKey, idem.HeaderReplayed, idem.HeaderBodyOmitted, idem.HeaderExpires, idem.HeaderOutcome,
		headerOriginalStatus, headerLookupTenant, headerLookupEndpoint,
	} {
		out.Del(name)
	}
	return out
}
