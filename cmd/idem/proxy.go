package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
)

func runProxy(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := addStoreFlags(fs, "directory of the idempotency store (one process at a time)")
	listen := fs.String("listen", "127.0.0.1:8081", "address to accept clients on; port 0 picks a free one")
	tlsf := addTLSFlags(fs, "", "listener")
	upstream := fs.String("upstream", "", "base URL of the service to protect, e.g. http://127.0.0.1:3000 (required)")
	tenantFrom := fs.String("tenant-from", "auth", "what scopes keys: auth (a digest of the Authorization header), header:NAME (that header's value, signed by the gateway in NAME-Signature when there is a tenant secret) or none (every caller shares one key space and so each other's stored answers; warned about at start)")
	tenantSecretFile := fs.String("tenant-secret-file", "", "file holding the deployment's tenant secret (at least 32 characters): with auth the tenant is the HMAC-SHA256 of Authorization under it, with header:NAME the header must carry the gateway's signature (default: the "+tenantSecretEnv+" environment variable)")
	ttl := fs.Duration("ttl", 0, "how long a key is remembered, at least ten leases (default 24h)")
	lease := fs.Duration("lease", 0, "how long a claim may run before it counts as abandoned (default 30s)")
	upstreamTimeout := fs.Duration("upstream-timeout", 0, "how long the upstream may take to answer in full; past it the outcome is recorded unknown (default 80% of the lease)")
	require := fs.String("require", "POST", "comma-separated methods that must carry an Idempotency-Key; a request with another unsafe method (PUT, PATCH, DELETE, ...) is protected when it carries one, and safe methods (GET, HEAD, OPTIONS, TRACE) pass through unrecorded")
	wait := fs.Duration("wait", 0, "how long a duplicate of a request still running waits for it before getting 409 (default 0: at once)")
	maxBody := byteSize(1 << 20)
	fs.Var(&maxBody, "max-body", "largest request body, a `SIZE` in bytes or with a unit (512KiB, 1MiB); larger ones get 413")
	maxStored := byteSize(idem.DefaultMaxBodyBytes)
	fs.Var(&maxStored, "max-stored-body", maxStoredHelp)
	store.addMemory()
	releaseStatus := fs.String("release-status", "", "upstream statuses that free the key instead of being stored, since the upstream committed nothing (e.g. 429,503): the answer reaches the client and a retry runs again; a `LIST` of codes (429), classes (5xx) and ranges (500-504), comma-separated (default none: every answer is stored)")
	unknownStatus := fs.String("unknown-status", "", "upstream statuses after which the outcome is recorded unknown, since the upstream may or may not have acted: the answer reaches the client and retries get 409 outcome_pending until an operator resolves the key; a `LIST` like --release-status's (default none)")
	replay := fs.String("replay", "all", replayHelp)
	replayHeaders := fs.String("replay-headers", "", "comma-separated upstream response header fields kept beside the status of an answer --replay keeps only the status of (Location, a request ID), and sent with the 410 its retries get (default none)")
	claimRate := fs.Float64("claim-rate", 0, claimRateHelp)
	claimBurst := fs.Int("claim-burst", 0, "new keys one tenant may claim at once before --claim-rate paces it (default: the rate, rounded up)")
	claimPerEndpoint := fs.Bool("claim-per-endpoint", false, "give each endpoint of a tenant a --claim-rate bucket of its own")
	var maxStoreSize byteSize
	fs.Var(&maxStoreSize, "max-store-size", "largest the store may grow, a `SIZE` (the files under --data, or with --store the table with its indexes): above it a new key gets 507 store_full with Retry-After while replays and claims already running go on (default 0: no bound; see "+docsURL("docs/problems.md#store_full")+")")
	minFreeDisk := byteSize(defaultMinFreeDisk)
	fs.Var(&minFreeDisk, "min-free-disk", "with --data, the room the disk must keep free, a `SIZE`: below it a new key gets 507 store_full, since a write the full disk refuses ends the process; 0 turns the check off")
	unstored := fs.String("unstored-headers", strings.Join(idemhttp.DefaultUnstored, ","), "comma-separated upstream response header fields never stored, so never replayed: the first caller gets them, a retry does not; empty stores every field (see "+docsURL("README.md#security")+")")
	strict := fs.Bool("strict-canonical", false, "refuse a JSON or form body that cannot be canonicalized (duplicate members, NaN, deep nesting, a bare % in a form) with 400 request_body_invalid; by default its raw bytes are fingerprinted instead, so a retry must send the same bytes")
	routesFile := fs.String("routes", "", "JSON `FILE` of per-route settings: an object mapping ServeMux patterns (POST /v1/charges/{id}) to their require, ttl, volatile, release_status, unknown_status, strict_canonical, replay, replay_headers, claim_rate and claim_burst; a request no route matches gets the flags' settings")
	drain := fs.Duration("drain", defaultDrain, "how long SIGTERM waits for requests in flight")
	adminAddr := fs.String("admin", "127.0.0.1:9464", "address of the operator's listener, serving /metrics and /healthz, and with an admin token the operator routes under /v1/admin/; port 0 picks a free one, empty turns it off")
	adminf := addAdminFlags(fs)
	problemBase := fs.String("problem-base", idemhttp.DefaultProblemBase, "absolute `URI` that begins the type of every problem document the proxy answers: the type is it followed by the code, and the answer links to it (Link rel=describedby); point it at a page or an anchor per code")
	reconcile := addReconcileFlags(fs)
	authCheck := fs.String("auth-check-url", "", authCheckHelp)
	events := fs.Bool("events", true, "log one line to standard error for every change of a record's state (claimed, replayed, completed, ...); --events=false silences them")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem proxy --upstream URL [--data DIR | --store DSN] [--listen ADDR]
                  [--tenant-from auth|header:NAME|none] [--tenant-secret-file FILE] [--ttl D] [--lease D]
                  [--upstream-timeout D] [--require METHODS] [--wait D]
                  [--max-body SIZE] [--max-stored-body SIZE] [--memory SIZE]
                  [--require-sync-standby]
                  [--release-status LIST] [--unknown-status LIST]
                  [--routes FILE] [--strict-canonical] [--replay all|public|status]
                  [--replay-headers LIST]
                  [--unstored-headers LIST]
                  [--claim-rate R [--claim-burst N] [--claim-per-endpoint]]
                  [--max-store-size SIZE] [--min-free-disk SIZE]
                  [--drain D]
                  [--admin ADDR] [--admin-token-file FILE]
                  [--admin-read-token-file FILE] [--metrics-token-file FILE]
                  [--admin-hosts LIST] [--admin-tls-cert FILE --admin-tls-key FILE
                  [--admin-client-ca FILE]]
                  [--reconcile-url URL] [--reconcile-attempts N]
                  [--reconcile-token-file FILE] [--auth-check-url URL]
                  [--problem-base URI] [--events=false]

Puts the idempotency-key contract in front of an HTTP service written in
any language. A request whose method is in --require must carry an
Idempotency-Key (any other unsafe method that carries one is treated
alike). The first is forwarded and its response recorded before the
client gets it; every retry gets that response again
(Idempotent-Replayed: true) without reaching the upstream. The same key
with a different request gets 422, a duplicate of one still running 409
with Retry-After. Responses over --max-stored-body are not kept: their
retries get 410 response_body_omitted. A replay never reaches the
upstream, so a revoked credential keeps its answers until they expire,
unless --auth-check-url checks each retry's credentials first:
`+docsURL("docs/proxy.md#checking-credentials-before-a-replay")+`

--routes FILE gives route patterns settings of their own (require, ttl,
volatile, release_status, unknown_status, strict_canonical, replay):
`+docsURL("docs/proxy.md#routes")+`

Every upstream answer is recorded unless --release-status (free the key)
or --unknown-status (record the outcome unknown) lists its status, or
the upstream says so in Idempotency-Outcome. A claim whose lease ran out
is never run again blindly: its retries get 409 outcome_pending until it
is resolved. With --reconcile-url the proxy asks the upstream once a
minute what became of each one: a 2xx answer is stored (with its status,
or the one Idempotency-Original-Status gives), a 404 says the operation
never took effect and frees the key, and after --reconcile-attempts
unanswered lookups the outcome is recorded unknown:
`+docsURL("docs/proxy.md#reconciling-with-the-upstream")+`

Records live in --data (one process at a time) or, with --store DSN, in
PostgreSQL shared by any number of proxies. --admin serves /metrics,
/healthz and, with an admin token, the operator routes that idem
inspect, get, resolve, check and compact use with --admin URL; a read
token opens the ones that only read. It answers only for IP addresses,
localhost and the names --admin-hosts lists:
`+docsURL("docs/operating.md#stuck-keys-while-the-service-runs")+`

Full reference: `+docsURL("docs/proxy.md")+`

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "idem proxy: "+format+"\n", a...)
		fs.Usage()
		return 2
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected argument %q", fs.Arg(0))
	}
	tlsConf, err := tlsf.config(stderr)
	if err != nil {
		return usageErr("%v", err)
	}
	if err := store.validate(); err != nil {
		return usageErr("%v", err)
	}
	target, err := parseUpstream(*upstream)
	if err != nil {
		return usageErr("%v", err)
	}
	tenancy, err := parseTenantFrom(*tenantFrom)
	if err == nil {
		err = tenancy.loadSecret(*tenantSecretFile)
	}
	if err != nil {
		return usageErr("%v", err)
	}
	var methods []string
	for m := range strings.SplitSeq(*require, ",") {
		if m = strings.ToUpper(strings.TrimSpace(m)); m != "" {
			methods = append(methods, m)
		}
	}
	if len(methods) == 0 {
		return usageErr("--require names no method")
	}
	var outcomes idemhttp.OutcomePolicy
	if outcomes.Release, err = parseStatuses(*releaseStatus); err != nil {
		return usageErr("--release-status: %v", err)
	}
	if outcomes.Unknown, err = parseStatuses(*unknownStatus); err != nil {
		return usageErr("--unknown-status: %v", err)
	}
	if *drain <= 0 {
		return usageErr("--drain %s must be positive", *drain)
	}
	replayPolicy, err := parseReplay(*replay)
	if err != nil {
		return usageErr("--replay %v", err)
	}
	unstoredNames := fieldList(*unstored)
	limits := idem.Limits{ClaimRate: *claimRate, ClaimBurst: *claimBurst, PerEndpoint: *claimPerEndpoint,
		MaxStoreBytes: int64(maxStoreSize), MinFreeBytes: int64(minFreeDisk)}
	if store.postgres() {
		limits.MinFreeBytes = 0 // the server's disk is not the proxy's to see
	}
	if err := checkLimits(limits, "--claim-rate", "--claim-burst"); err != nil {
		return usageErr("%v", err)
	}
	if limits.ClaimBurst > 0 && limits.ClaimRate == 0 {
		return usageErr("--claim-burst needs --claim-rate")
	}
	if maxBody <= 0 {
		return usageErr("--max-body %d must be positive", maxBody)
	}
	if maxStored <= 0 {
		return usageErr("--max-stored-body %d must be positive", maxStored)
	}
	log := newLogger(stderr)
	if w := tenancy.warning(); w != "" {
		log.Warn("idem proxy: " + w)
	}
	effectiveLease := *lease
	if effectiveLease == 0 {
		effectiveLease = idem.DefaultLease
	}
	timeout := *upstreamTimeout
	switch {
	case timeout == 0:
		timeout = effectiveLease * 8 / 10
	case timeout < 0 || timeout >= effectiveLease:
		// Past its lease a claim counts as abandoned: duplicates would be
		// told the outcome is pending while the first attempt still runs.
		return usageErr("--upstream-timeout %s must be positive and shorter than the lease (%s)", timeout, effectiveLease)
	}

	rc, err := reconcile.reconciler(timeout, int64(maxStored), log, stderr)
	if err != nil {
		return usageErr("%v", err)
	}
	if rc != nil {
		rc.unstored = unstoredNames
	}
	checker, err := newAuthChecker(*authCheck, tenancy.header, timeout)
	if err != nil {
		return usageErr("%v", err)
	}

	var routes *routeTable
	var endpointTTL map[string]time.Duration
	if *routesFile != "" {
		// The store refuses a TTL under idem.MinTTLLeases leases;
		// said here, the message can name the route's line.
		if routes, err = readRoutes(*routesFile, idem.MinTTLLeases*effectiveLease); err != nil {
			fmt.Fprintf(stderr, "idem proxy: --routes %v\n", err)
			return 2
		}
		endpointTTL = routes.ttls()
	}

	guard, adminTLS, err := adminf.load(stderr)
	if err != nil {
		return usageErr("%v", err)
	}
	db, code := store.openServer("proxy", serverOptions{ttl: *ttl, endpointTTL: endpointTTL, lease: *lease, maxBodyBytes: int64(maxStored), logger: log, events: *events,
		reconcile: rc.reconcileFunc()}, stderr)
	if db == nil {
		if code == 2 {
			fs.Usage()
		}
		return code
	}
	adm, err := newAdmin(db, log)
	if err != nil {
		db.Close()
		fmt.Fprintf(stderr, "idem proxy: %v\n", err)
		return 1
	}
	base := idemhttp.Options{
		Store:           db,
		Tenant:          tenancy.tenant,
		AuthorizeReplay: checker.authorizeFunc(),
		Replay:          replayPolicy,
		Unstored:        unstoredNames,
		StatusHeaders:   fieldList(*replayHeaders),
		Methods:         methods,
		MaxRequestBytes: int64(maxBody),
		Wait:            *wait,
		Outcomes:        outcomes,
		RawFallback:     !*strict,
		ProblemBase:     *problemBase,
		Logger:          log,
		Observe:         adm.observer.Observe,
	}
	fallback := base
	if fallback.Store, err = idem.Limit(db, limits); err != nil {
		db.Close()
		return usageErr("%v", err)
	}
	mw, err := idemhttp.New(fallback)
	if err != nil {
		db.Close()
		return usageErr("%v", err)
	}
	forward := newProxyHandler(target, timeout, *problemBase, log)
	protected := mw(forward)
	if routes != nil {
		if err := routes.build(base, limits, forward); err != nil {
			db.Close()
			fmt.Fprintf(stderr, "idem proxy: --routes %v\n", err)
			return 2
		}
		protected = routes.handler(protected)
	}
	h := http1Only(*problemBase, refuseReserved(rc.reservedPath(target), target, *problemBase, protected))
	var adminH http.Handler
	if *adminAddr != "" {
		mux := http.NewServeMux()
		adm.register(mux, guard)
		adm.registerOps(mux, guard)
		adminH = guard.guard(mux)
	}
	return serveUntilSignal("proxy", *listen, tlsConf, store.where(), *drain, h, *adminAddr, adminTLS, adminH, db, stdout, stderr)
}

// fieldList reads a comma-separated list of header field names; it is
// never nil, so that an empty list means none rather than the default.
func fieldList(s string) []string {
	out := []string{}
	for name := range strings.SplitSeq(s, ",") {
		if name = strings.TrimSpace(name); name != "" {
			out = append(out, name)
		}
	}
	return out
}

func parseUpstream(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("--upstream is required")
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("--upstream: %v", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--upstream %q must be an http:// or https:// URL with a host", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("--upstream %q must not have a query or fragment", s)
	}
	return u, nil
}

// parseStatuses reads a list of statuses: comma-separated codes (429),
// classes (5xx) and ranges (500-504), each between 200 and 999.
func parseStatuses(s string) ([]int, error) {
	var out []int
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(item, "-")
		if class, ok := strings.CutSuffix(item, "xx"); ok && len(class) == 1 && !isRange {
			lo, hi = class+"00", class+"99"
		} else if !isRange {
			hi = lo
		}
		from, err1 := strconv.Atoi(lo)
		to, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || len(lo) != 3 || len(hi) != 3 || from > to || from < 200 {
			return nil, fmt.Errorf("%q is not a status (429), a class (5xx) or a range (500-504) of final statuses", item)
		}
		for st := from; st <= to; st++ {
			out = append(out, st)
		}
	}
	return out, nil
}

// oneHeader returns the single, non-empty value of the header name.
func oneHeader(r *http.Request, name string) (string, error) {
	vs := r.Header.Values(name)
	switch {
	case len(vs) == 0 || (len(vs) == 1 && strings.TrimSpace(vs[0]) == ""):
		return "", fmt.Errorf("no %s header: keys are scoped by it", name)
	case len(vs) > 1:
		return "", fmt.Errorf("the %s header is sent more than once", name)
	}
	return vs[0], nil
}

// http1Only refuses a request that is not HTTP/1.x. The listener speaks
// HTTP/1 alone, and net/http hands the HTTP/2 connection preface to the
// handler as a request "PRI *", so that a handler may take the connection
// over; forwarded, it would reach the upstream as a request for "/*".
func http1Only(problemBase string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 {
			w.Header().Set("Connection", "close")
			writeProblem(w, idemhttp.Problem{Type: problemBase + codeHTTPVersion, Status: http.StatusHTTPVersionNotSupported, Code: codeHTTPVersion,
				Detail: "the proxy speaks HTTP/1.1; HTTP/2 without TLS (prior knowledge) is not served"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// The codes of the problems the proxy answers itself, beside the
// middleware's; docs/problems.md documents each under its name.
const (
	codeUpstreamUnavailable = "upstream_unavailable"       // 502: nothing was sent; the key is free
	codeUpstreamFailed      = "upstream_failed"            // 502: sent, then lost; the outcome is unknown
	codeUpstreamTimeout     = "upstream_timeout"           // 504: sent, no answer in time; the outcome is unknown
	codeHTTPVersion         = "http_version_not_supported" // 505: not HTTP/1.x
	codePathReserved        = "path_reserved"              // 403: the reconciler's lookup path, not forwarded
)

// dialError marks a failure to connect to the upstream: the request was
// certainly not sent, so nothing can have happened there.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// upstreamIdleConns is how many idle connections to the upstream the proxy
// keeps: enough for the concurrency one proxy serves.
const upstreamIdleConns = 256

// upstreamTransport is the base of the transports that reach the
// upstream: the proxy's and the reconciler's. The upstream is a
// neighbour, not something behind HTTP_PROXY. And the client's
// Accept-Encoding goes upstream as it came: otherwise the Transport asks
// for gzip on its own when the client did not, and decompresses the
// answer, whose length is then unknown, so ReverseProxy flushes every
// write and the recorder streams an answer it could have held whole,
// after spending a processor inflating it; a lookup's answer is stored
// as it came too. An answer whose header is larger than a store keeps is
// cut off at the transport, before the proxy buffers megabytes of it.
func upstreamTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DisableCompression = true
	tr.MaxResponseHeaderBytes = idem.MaxResponseHeaderBytes
	return tr
}

// newProxyHandler forwards to target, streaming the response back. Its
// own problems are typed under problemBase.
func newProxyHandler(target *url.URL, timeout time.Duration, problemBase string, log *slog.Logger) http.Handler {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	tr := upstreamTransport()
	// Every request goes to the one upstream host. net/http keeps two idle
	// connections per host by default, so under concurrency most requests
	// would dial anew and leave a socket in TIME_WAIT behind them.
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = upstreamIdleConns, upstreamIdleConns
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, &dialError{err}
		}
		return c, nil
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			hideKeyFromTransport(pr.Out.Header)
			if inMemoryBody(pr.In.Body) {
				pr.Out.Body = pr.In.Body
			}
		},
		// The middleware already set the fields of the contract on the
		// response; an upstream that echoes the key too would otherwise
		// send it twice, and first answers would differ from replays.
		ModifyResponse: func(res *http.Response) error {
			applyOutcome(res, log)
			for _, name := range []string{idem.HeaderKey, idem.HeaderReplayed, idem.HeaderBodyOmitted, idem.HeaderExpires, idem.HeaderOutcome} {
				res.Header.Del(name)
			}
			return nil
		},
		Transport:  tr,
		BufferPool: &copyBuffers{},
		ErrorLog:   slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// No periodic flushing: an answer of known length then reaches the
		// client only once its outcome is stored. ReverseProxy still
		// flushes each write of a response without a length and of
		// server-sent events, so those stream, and the middleware holds
		// back only their end.
		FlushInterval: 0,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("idem proxy: upstream request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			upstreamError(w, r, problemBase, err)
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The middleware's context ignores the client hanging up, so that
		// the upstream's answer is still recorded; this bounds how long a
		// claim can wait for it.
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		rp.ServeHTTP(w, r.WithContext(ctx))
	})
}

// copyBuffers lends ReverseProxy the buffers it copies response bodies
// through. Without a pool it allocates a new one for every response, which
// is most of what the proxy allocates.
type copyBuffers struct{ pool sync.Pool }

// copyBufferBytes is the size of each buffer, ReverseProxy's own.
const copyBufferBytes = 32 << 10

func (b *copyBuffers) Get() []byte {
	if p, ok := b.pool.Get().(*[]byte); ok {
		return *p
	}
	return make([]byte, copyBufferBytes)
}

func (b *copyBuffers) Put(buf []byte) { b.pool.Put(&buf) }

// applyOutcome tells the middleware what the upstream said of its answer
// in idem.HeaderOutcome. The response's request is the one the proxy
// sent, whose context carries the middleware's outcome. A value the proxy
// does not know changes nothing: the status lists decide, as if the
// upstream had said nothing.
func applyOutcome(res *http.Response, log *slog.Logger) {
	vs := res.Header.Values(idem.HeaderOutcome)
	if len(vs) == 0 {
		return
	}
	switch v := strings.ToLower(strings.TrimSpace(strings.Join(vs, ","))); v {
	case "release":
		idemhttp.Release(res.Request)
	case "unknown":
		idemhttp.MarkUnknown(res.Request)
	case "store":
		idemhttp.Keep(res.Request)
	default:
		log.Warn("idem proxy: the upstream's "+idem.HeaderOutcome+" is not release, unknown or store; ignored",
			"method", res.Request.Method, "path", res.Request.URL.Path, "value", v)
	}
}

// The two types io.NopCloser returns. The middleware hands on a request
// body it has read whole as io.NopCloser(bytes.NewReader(body)).
var (
	nopCloserType         = reflect.TypeOf(io.NopCloser(struct{ io.Reader }{}))
	nopCloserWriterToType = reflect.TypeOf(io.NopCloser(bytes.NewReader(nil)))
)

// inMemoryBody reports whether body is an io.NopCloser around a
// *bytes.Reader, *bytes.Buffer or *strings.Reader: reading it never waits
// for the client, and closing it does nothing.
//
// ReverseProxy wraps every outgoing body in a reader of its own, so that
// the Transport's Close cannot reach the client's body. The Transport
// then no longer recognises a body held in memory, and writes the request
// head and the body in two writes, each a segment of its own, the
// upstream waking twice. Such a body needs no protection from Close, so
// the proxy gives it to the Transport as it is.
func inMemoryBody(body io.ReadCloser) bool {
	if t := reflect.TypeOf(body); t != nopCloserType && t != nopCloserWriterToType {
		return false
	}
	switch reflect.ValueOf(body).Field(0).Interface().(type) {
	case *bytes.Reader, *bytes.Buffer, *strings.Reader:
		return true
	}
	return false
}

// hideKeyFromTransport stores the idempotency key fields under their
// lower-case names. net/http's Transport takes a request that carries
// Idempotency-Key (and has no body, or a rewindable one) as safe to send
// twice, and quietly resends it when a reused connection breaks before the
// answer. Behind this proxy the upstream may not deduplicate at all, which
// is why the proxy is there, so a second send would be a second execution.
// The Transport looks the field up by its canonical name only; on the wire
// field names are case-insensitive, so the upstream still gets the key.
func hideKeyFromTransport(h http.Header) {
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		if vs, ok := h[name]; ok {
			delete(h, name)
			h[strings.ToLower(name)] = vs
		}
	}
}

// upstreamError answers a request the upstream did not answer. ReverseProxy
// passes the outgoing request, whose context still carries the
// middleware's outcome, so Release and MarkUnknown reach it.
func upstreamError(w http.ResponseWriter, r *http.Request, problemBase string, err error) {
	var de *dialError
	status, code, detail := http.StatusBadGateway, codeUpstreamUnavailable, "the upstream could not be reached; nothing was sent, so a retry with the same key runs the request"
	switch {
	case errors.As(err, &de):
		idemhttp.Release(r)
	case errors.Is(err, context.DeadlineExceeded):
		idemhttp.MarkUnknown(r)
		status, code, detail = http.StatusGatewayTimeout, codeUpstreamTimeout, "the upstream did not answer in time; it may have acted, so the outcome is recorded unknown"
	default:
		idemhttp.MarkUnknown(r)
		code, detail = codeUpstreamFailed, "the upstream failed after the request was sent; it may have acted, so the outcome is recorded unknown"
	}
	// The cause goes to the log, not to the client: it names the
	// upstream's address.
	writeProblem(w, idemhttp.Problem{Type: problemBase + code, Status: status, Code: code, Detail: detail})
}
