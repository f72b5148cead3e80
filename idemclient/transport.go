package idemclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemkv/idem"
)

// Defaults of the Options fields that have numeric limits.
const (
	DefaultMaxAttempts   = 5
	DefaultMaxElapsed    = time.Minute
	DefaultMaxRetryAfter = 30 * time.Second
	DefaultDrainBytes    = 64 << 10
)

// Options configure a Transport. The zero value of each field selects its
// default; a nil *Options selects every default.
type Options struct {
	// Base sends each attempt. Default: http.DefaultTransport.
	Base http.RoundTripper

	// Header is the request header that carries the key. Default:
	// "Idempotency-Key".
	Header string

	// Methods lists the methods whose requests get a key when they carry
	// none. A request that already carries one keeps it, whatever its
	// method. Default: POST only.
	Methods []string

	// NewKey makes the key of a new operation. Keys must be unique per
	// operation and never derived from the request. Default: NewKey, a
	// random UUID from crypto/rand.
	NewKey func() (string, error)

	// KeyStore, when set, keeps the key of every named operation (see
	// WithOperation) so that it survives a restart of the client: the key
	// is stored before the first attempt is sent and the operation is
	// marked done once a definitive response arrives. Default: none; keys
	// live only for one call.
	KeyStore KeyStore

	// CheckRetry decides which outcomes are retried. Default:
	// DefaultCheckRetry.
	CheckRetry CheckRetry

	// Backoff decides how long to wait between attempts. Default:
	// DefaultBackoff.
	Backoff Backoff

	// Definitive decides which final responses mark an operation done in
	// the KeyStore. Default: DefaultDefinitive.
	Definitive Definitive

	// Refresh, when set, is called once per call when a response is 401:
	// it should obtain fresh credentials and set them on req, which is the
	// request every later attempt is copied from. The attempt is then
	// repeated at once with the same key. Without Refresh, or on a second
	// 401, the 401 is returned to the caller. Default: none.
	Refresh func(ctx context.Context, req *http.Request) error

	// MaxAttempts caps the attempts of one call, the first included.
	// Default: 5.
	MaxAttempts int

	// MaxElapsed caps the time from the first attempt to the start of the
	// last: the Transport does not begin a wait that would end past it.
	// Default: 1 minute.
	MaxElapsed time.Duration

	// MaxRetryAfter is the longest Retry-After the Transport waits for. A
	// server that asks for longer gets no retry: the call ends at once,
	// since retrying sooner than asked would only be refused again.
	// Default: 30 seconds.
	MaxRetryAfter time.Duration

	// DrainBytes is how much of a retried response's body is read and
	// discarded before it is closed, so that its connection can be reused.
	// A longer body's connection is closed instead. Default: 64 KiB.
	DrainBytes int64

	// Now is the clock, used for MaxElapsed and for Retry-After dates.
	// Default: time.Now.
	Now func() time.Time

	// sleep waits for d or until ctx is done, whichever comes first, and
	// returns ctx's error in the second case: a timer, which this
	// package's tests replace so that backoffs take no time.
	sleep func(ctx context.Context, d time.Duration) error

	// Logger receives a debug line per retry and a warning when an
	// operation cannot be marked done. Default: slog.Default().
	Logger *slog.Logger
}

// withDefaults returns a validated copy of o with every default filled in,
// reporting every bad field at once.
func (o *Options) withDefaults() (Options, error) {
	var c Options
	if o != nil {
		c = *o
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: idemclient: "+format, append([]any{idem.ErrInvalidOptions}, args...)...))
	}
	if c.Base == nil {
		c.Base = http.DefaultTransport
	}
	if c.Header == "" {
		c.Header = idem.HeaderKey
	}
	if !isToken(c.Header) {
		bad("Header %q is not a valid header name", c.Header)
	}
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost}
	}
	for _, m := range c.Methods {
		if !isToken(m) {
			bad("Methods: %q is not a valid method", m)
		}
	}
	if c.NewKey == nil {
		c.NewKey = NewKey
	}
	if c.CheckRetry == nil {
		c.CheckRetry = DefaultCheckRetry
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	if c.Definitive == nil {
		c.Definitive = DefaultDefinitive
	}
	limit := func(name string, p *time.Duration, def time.Duration) {
		switch {
		case *p == 0:
			*p = def
		case *p < 0:
			bad("%s %s must not be negative", name, *p)
		}
	}
	limit("MaxElapsed", &c.MaxElapsed, DefaultMaxElapsed)
	limit("MaxRetryAfter", &c.MaxRetryAfter, DefaultMaxRetryAfter)
	switch {
	case c.MaxAttempts == 0:
		c.MaxAttempts = DefaultMaxAttempts
	case c.MaxAttempts < 0:
		bad("MaxAttempts %d must not be negative", c.MaxAttempts)
	}
	switch {
	case c.DrainBytes == 0:
		c.DrainBytes = DefaultDrainBytes
	case c.DrainBytes < 0:
		bad("DrainBytes %d must not be negative", c.DrainBytes)
	}
	if c.sleep == nil {
		c.sleep = sleep
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, errors.Join(errs...)
}

// isToken reports whether s is a non-empty RFC 9110 token, the syntax of
// both header names and methods.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// sleep waits on a timer; see Options.sleep.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Transport is an http.RoundTripper that sends requests through a base
// transport and retries them safely: every request that needs a key gets
// one for the whole call, and every retry repeats that key, so the server
// runs the operation at most once however many attempts reach it.
//
// Requests without a key are retried only if their method is idempotent
// (GET, HEAD, OPTIONS, TRACE, PUT, DELETE); any other one is sent exactly
// once, as a server could not tell its retry from a second operation.
//
// A call that ends without a final response returns a *RetryError. A
// final response is returned as is, whatever its status; Replayed, Key and
// Attempts describe it. A Transport is safe for concurrent use.
//
// Put it in an http.Client, &http.Client{Transport: t}, and name each
// operation on its request's context with WithOperation. The client's
// Timeout then bounds a whole call, retries and waits included, and
// http.Client.Do returns the *RetryError inside a *url.Error, where
// errors.As finds it.
type Transport struct {
	o       Options
	methods map[string]bool
}

// NewTransport returns a Transport configured by opts, or an error that
// matches idem.ErrInvalidOptions for each bad field.
func NewTransport(opts *Options) (*Transport, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &Transport{o: o, methods: make(map[string]bool, len(o.Methods))}
	for _, m := range o.Methods {
		t.methods[m] = true
	}
	return t, nil
}

// CloseIdleConnections closes the base transport's idle connections, if it
// keeps any, so that http.Client.CloseIdleConnections reaches them.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.o.Base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// operationKey is the context key of WithOperation.
type operationKey struct{}

// WithOperation returns a context naming the logical operation its requests
// belong to. With a KeyStore, a request under this name reuses the key the
// name already has, even one stored by an earlier process, so a client
// that restarts in the middle of an operation resumes it instead of
// starting a second one. Names must be unique per operation (an order
// number, an outbox row id) and at most 255 bytes for StoreKeyStore.
func WithOperation(ctx context.Context, op string) context.Context {
	return context.WithValue(ctx, operationKey{}, op)
}

// Operation returns the operation name set by WithOperation, or "".
func Operation(ctx context.Context) string {
	op, _ := ctx.Value(operationKey{}).(string)
	return op
}

// attemptKey is the context key of the attempt requests' attemptInfo.
type attemptKey struct{}

// attemptInfo travels on each attempt's request context, so that Key and
// Attempts can read it back from the response whatever the header name.
type attemptInfo struct {
	key     string
	attempt int
}

func info(resp *http.Response) attemptInfo {
	if resp == nil || resp.Request == nil {
		return attemptInfo{}
	}
	i, _ := resp.Request.Context().Value(attemptKey{}).(attemptInfo)
	return i
}

// Key returns the idempotency key a Transport sent for resp, or "" if the
// request carried none or did not go through a Transport.
func Key(resp *http.Response) string { return info(resp).key }

// Attempts returns which attempt of its call resp answered (1 for the
// first), or 0 if the request did not go through a Transport.
func Attempts(resp *http.Response) int { return info(resp).attempt }

// Replayed reports whether the server answered resp from its store rather
// than by running the operation: the operation had already run, and resp
// is its original outcome.
func Replayed(resp *http.Response) bool {
	return resp != nil && strings.EqualFold(strings.TrimSpace(resp.Header.Get(idem.HeaderReplayed)), "true")
}

// idempotentMethod reports whether repeating a request with method m has
// the effect of sending it once (RFC 9110, section 9.2.2).
func idempotentMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace,
		http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// RoundTrip sends req, retrying it as the Transport's policy allows.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	given := req.Header.Get(t.o.Header)
	keyed := given != "" || t.methods[req.Method]
	if !keyed && !idempotentMethod(req.Method) {
		return t.o.Base.RoundTrip(req)
	}
	c := &call{t: t, req: req, op: Operation(ctx)}
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		// Refusing now, rather than at the first retry, makes the mistake
		// show on the first request instead of on the first bad network day.
		req.Body.Close()
		return nil, c.fail("refused the request", ErrBodyNotRewindable)
	}
	if keyed {
		key, err := t.key(ctx, c.op, given)
		if err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, c.fail("refused the request", err)
		}
		c.key = key
	}
	return c.run()
}

// key returns the key of a call: the request's own, or the one the
// KeyStore holds for the operation, or a new one.
func (t *Transport) key(ctx context.Context, op, given string) (string, error) {
	key := given
	if key == "" {
		k, err := t.o.NewKey()
		if err != nil {
			return "", fmt.Errorf("idemclient: generate key: %w", err)
		}
		if k == "" {
			return "", errors.New("idemclient: generate key: NewKey returned an empty key")
		}
		key = k
	}
	if op == "" || t.o.KeyStore == nil {
		return key, nil
	}
	stored, err := t.o.KeyStore.Save(ctx, op, key)
	if err != nil {
		return "", fmt.Errorf("idemclient: store the key of operation %q: %w", op, err)
	}
	if given != "" && stored != given {
		return "", fmt.Errorf("idemclient: operation %q already has a key other than the request's %s header", op, t.o.Header)
	}
	return stored, nil
}

// call is the state of one RoundTrip.
type call struct {
	t        *Transport
	req      *http.Request // as the caller passed it; never modified
	op       string
	key      string
	attempts int // attempts sent so far
	status   int // status of the last response, 0 if none
}

func (c *call) fail(why string, err error) *RetryError {
	return &RetryError{Key: c.key, Operation: c.op, Attempts: c.attempts, LastStatus: c.status, Err: err, why: why}
}

func (c *call) run() (*http.Response, error) {
	t, ctx := c.t, c.req.Context()
	// work is what each attempt is copied from; Refresh may change it.
	work := c.req.Clone(ctx)
	if c.key != "" {
		work.Header.Set(t.o.Header, c.key)
	}
	start := t.o.Now()
	refreshed := false
	for {
		a, err := c.next(work)
		if err != nil {
			return nil, c.fail("could not rewind the body", err)
		}
		resp, err := t.o.Base.RoundTrip(a)
		c.attempts++
		switch {
		case err == nil && resp == nil:
			err = errors.New("idemclient: base transport returned neither a response nor an error")
		case err != nil && resp != nil:
			// Against the RoundTripper contract; the error wins.
			t.drain(resp)
			resp = nil
		}
		c.status = 0
		if err == nil {
			c.status = resp.StatusCode
			if resp.Request == nil {
				resp.Request = a
			}
		}

		if err == nil && resp.StatusCode == http.StatusUnauthorized && t.o.Refresh != nil &&
			!refreshed && c.attempts < t.o.MaxAttempts {
			refreshed = true
			t.drain(resp)
			if err := t.o.Refresh(ctx, work); err != nil {
				return nil, c.fail("could not refresh credentials", err)
			}
			continue
		}

		retry, cerr := t.o.CheckRetry(ctx, resp, err)
		if cerr != nil {
			t.drain(resp)
			return nil, c.fail("stopped", cerr)
		}
		if !retry {
			if err != nil {
				return nil, c.fail("stopped", err)
			}
			c.settle(resp)
			return resp, nil
		}

		cause := err
		if resp != nil {
			cause = statusError(resp)
		}
		if c.attempts >= t.o.MaxAttempts {
			t.drain(resp)
			return nil, c.fail("gave up at the attempt limit", cause)
		}
		now := t.o.Now()
		wait := t.o.Backoff(c.attempts, resp)
		if ra, ok := RetryAfter(resp, now); ok {
			if ra > t.o.MaxRetryAfter {
				t.drain(resp)
				return nil, c.fail(fmt.Sprintf("gave up (the server asked for a wait of %s, beyond MaxRetryAfter)", ra), cause)
			}
			wait = max(wait, ra)
		}
		if now.Add(wait).Sub(start) > t.o.MaxElapsed {
			t.drain(resp)
			return nil, c.fail("gave up at the time limit", cause)
		}
		t.drain(resp)
		t.o.Logger.LogAttrs(ctx, slog.LevelDebug, "idemclient: retrying",
			slog.String("operation", c.op), slog.String("key_hash", keyHash(c.key)),
			slog.Int("attempt", c.attempts), slog.Int("status", c.status),
			slog.Any("err", err), slog.Duration("wait", wait))
		if err := t.o.sleep(ctx, wait); err != nil {
			return nil, c.fail("stopped while waiting to retry", err)
		}
	}
}

// next builds the request of the next attempt: a copy of work with a fresh
// body and the call's details on its context.
func (c *call) next(work *http.Request) (*http.Request, error) {
	a := work.Clone(context.WithValue(c.req.Context(), attemptKey{}, attemptInfo{key: c.key, attempt: c.attempts + 1}))
	if c.attempts == 0 || c.req.Body == nil || c.req.Body == http.NoBody {
		return a, nil
	}
	body, err := c.req.GetBody()
	if err != nil {
		return nil, fmt.Errorf("idemclient: GetBody: %w", err)
	}
	a.Body = body
	return a, nil
}

// settle marks the call's operation done if resp is definitive. A failure
// is only logged: the response is real and must reach the caller, and an
// operation left open merely gets its key sent again, which replays.
func (c *call) settle(resp *http.Response) {
	t := c.t
	if c.op == "" || c.key == "" || t.o.KeyStore == nil || !t.o.Definitive(resp) {
		return
	}
	// The answer has arrived; a cancellation now must not lose the record.
	ctx := context.WithoutCancel(c.req.Context())
	if err := t.o.KeyStore.Done(ctx, c.op, resp.StatusCode); err != nil {
		t.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idemclient: could not mark operation done",
			slog.String("operation", c.op), slog.Int("status", resp.StatusCode), slog.Any("err", err))
	}
}

// drain reads up to DrainBytes of a response body that will not be used
// and closes it, so that the connection goes back to the pool.
func (t *Transport) drain(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, t.o.DrainBytes)
	_ = resp.Body.Close()
}

// statusError describes a retryable response that ended a call.
func statusError(resp *http.Response) error {
	msg := fmt.Sprintf("idemclient: server answered %d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
	if code := ProblemCode(resp); code != "" {
		msg += " (" + code + ")"
	}
	return errors.New(msg)
}

// keyHash keeps keys out of logs while letting lines of one call be
// matched with the server's, which logs the same digest.
func keyHash(key string) string {
	if key == "" {
		return ""
	}
	return idem.KeyHash(key)
}
