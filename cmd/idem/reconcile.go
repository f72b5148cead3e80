package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idem"
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
	"what became of its operation: {key}, {tenant} and {endpoint} in its path or query are replaced by the claim's, escaped. " +
	"A 2xx answer is the operation's response and is stored for replays (its status, or the one in " + headerOriginalStatus + "), " +
	"404 means the operation never took effect and frees the key, anything else is asked again a minute later " +
	"(default none: such claims wait for an operator)"

const reconcileAttemptsHelp = "how many lookups of one claim may go unanswered (an error, or a status other than 2xx and 404) " +
	"before its outcome is recorded unknown, for an operator to resolve; 0 asks until the key expires"

// reconcileFlags are --reconcile-url and --reconcile-attempts.
type reconcileFlags struct {
	url      string
	attempts int
}

func addReconcileFlags(fs *flag.FlagSet) *reconcileFlags {
	f := &reconcileFlags{}
	fs.StringVar(&f.url, "reconcile-url", "", reconcileURLHelp)
	fs.IntVar(&f.attempts, "reconcile-attempts", defaultReconcileAttempts, reconcileAttemptsHelp)
	return f
}

// reconciler returns the reconciler the flags describe, or nil when there
// is no --reconcile-url. Each lookup may take timeout, and an answer
// larger than maxBody is not stored.
func (f *reconcileFlags) reconciler(timeout time.Duration, maxBody int64, log *slog.Logger) (*reconciler, error) {
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
	return newReconciler(u, timeout, maxBody, f.attempts, log), nil
}

// lookupURL is a --reconcile-url: a URL whose path and query may hold the
// placeholders {key}, {tenant} and {endpoint}.
type lookupURL struct {
	raw   string
	query int // where the query begins in raw, or len(raw)
}

var lookupPlaceholders = []string{"{key}", "{tenant}", "{endpoint}"}

// parseLookupURL checks s: an http or https URL with a host, no user
// information and no fragment, whose placeholders are known ones and stay
// out of its scheme and host.
func parseLookupURL(s string) (*lookupURL, error) {
	bare := s
	for _, p := range lookupPlaceholders {
		bare = strings.ReplaceAll(bare, p, "x")
	}
	if i := strings.IndexAny(bare, "{}"); i >= 0 {
		return nil, fmt.Errorf("%q: braces hold only {key}, {tenant} or {endpoint}", s)
	}
	u, err := url.Parse(bare)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" || strings.Contains(bare, "#") {
		return nil, fmt.Errorf("%q must be an http:// or https:// URL with a host, and no user or fragment", s)
	}
	rest := s[len(u.Scheme)+len("://"):]
	if end := strings.IndexAny(rest, "/?"); end >= 0 {
		rest = rest[:end]
	}
	if strings.Contains(rest, "{") {
		return nil, fmt.Errorf("%q: placeholders go in the path or the query, not the host", s)
	}
	q := strings.IndexByte(s, '?')
	if q < 0 {
		q = len(s)
	}
	return &lookupURL{raw: s, query: q}, nil
}

// expand fills in the placeholders for sc, each escaped for the part of
// the URL it is in: a key with a slash stays one path segment, one with
// an ampersand one query value.
func (u *lookupURL) expand(sc idem.Scope) string {
	values := []string{sc.Key, sc.Tenant, sc.Endpoint}
	var path, query []string
	for i, p := range lookupPlaceholders {
		path = append(path, p, url.PathEscape(values[i]))
		query = append(query, p, url.QueryEscape(values[i]))
	}
	return strings.NewReplacer(path...).Replace(u.raw[:u.query]) + strings.NewReplacer(query...).Replace(u.raw[u.query:])
}

// reconciler asks the upstream what became of overdue claims; its
// Reconcile is the store's Options.Reconcile.
type reconciler struct {
	url      *lookupURL
	client   *http.Client
	timeout  time.Duration
	maxBody  int64
	attempts int // unanswered lookups before the outcome is recorded unknown; 0: no bound
	log      *slog.Logger
}

func newReconciler(u *lookupURL, timeout time.Duration, maxBody int64, attempts int, log *slog.Logger) *reconciler {
	return &reconciler{
		url: u,
		client: &http.Client{
			Transport: upstreamTransport(),
			// A redirect is not an answer: followed, a login page would
			// pass for the operation's response.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
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
// hold the lookup's URL, which holds the key.
func (rc *reconciler) lookup(ctx context.Context, sc idem.Scope) (verdict, idem.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, rc.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rc.url.expand(sc), nil)
	if err != nil {
		return undecided, idem.Response{}, errors.New("lookup: the expanded --reconcile-url does not parse")
	}
	req.Header.Set("User-Agent", lookupUserAgent)
	req.Header.Set(idem.HeaderKey, sc.Key)
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
	return found, idem.Response{Status: status, Header: lookupHeader(resp.Header), Body: body}, nil
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
		headerOriginalStatus,
	} {
		out.Del(name)
	}
	return out
}
