package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/pebblestore"
)

// Timeouts of the HTTP servers behind the proxy. They bound what a
// slow or idle client can hold (slow-loris); none bounds the handler, whose
// work is the operation being made idempotent. There is no WriteTimeout for
// that reason: it would cut off a slow payment provider or a streamed
// upstream response, and a response cut off midway is recorded unknown.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = time.Minute
	idleTimeout       = 2 * time.Minute
)

// maxStoredHelp is --max-stored-body's help, shown by the proxy.
const maxStoredHelp = "largest response body kept for replays, a `SIZE` in bytes or with a unit (512KiB, 4MiB); a retry of a request whose answer was larger gets 410 response_body_omitted, with the original status, instead of that answer. At most 1GiB with --data, 256MiB with --store"

// defaultDrain is how long a stopping server waits for requests in flight.
const defaultDrain = 30 * time.Second

// adminDrain is how long a stopping admin server waits for a scrape or a
// health check in flight.
const adminDrain = time.Second

// openStore opens the data directory for the command called name and turns
// the failures a person can act on into messages and exit statuses: bad
// options are usage errors (2), a directory held by another process is a
// plain failure (1) that says so.
func openStore(name, dir string, opts *pebblestore.Options, stderr io.Writer) (idem.Operator, int) {
	db, err := pebblestore.Open(dir, opts)
	switch {
	case err == nil:
		return db, 0
	case errors.Is(err, idem.ErrInvalidOptions):
		fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
		return nil, 2
	case errors.Is(err, pebblestore.ErrLocked):
		fmt.Fprintf(stderr, "idem %s: data directory %s is in use: another idem process holds it; stop that process or pass another --data\n(%v)\n", name, dir, err)
		return nil, 1
	default:
		fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
		return nil, 1
	}
}

// tlsFlags are --tls-cert and --tls-key, which the proxy takes for its
// client listener, and with a prefix for its admin listener.
type tlsFlags struct {
	prefix    string
	cert, key *string
}

func addTLSFlags(fs *flag.FlagSet, prefix, listener string) *tlsFlags {
	return &tlsFlags{
		prefix: prefix,
		cert:   fs.String(prefix+"tls-cert", "", "PEM certificate `FILE`, its chain after it, for the "+listener+" to serve HTTPS with instead of HTTP; needs --"+prefix+"tls-key"),
		key:    fs.String(prefix+"tls-key", "", "PEM private key `FILE` of --"+prefix+"tls-cert"),
	}
}

// config returns the listener's TLS configuration, or nil for plain HTTP.
// It offers HTTP/1.1 alone, as the plain listener serves it: the proxy
// answers only HTTP/1.x, and one protocol on both keeps them alike. On
// TLS 1.2 it offers AEAD suites with forward secrecy alone (TLS 1.3 has
// no others). The pair is read again when either file changes, so a
// renewed certificate needs no restart; one that does not load is
// reported to stderr and the previous pair stays in use.
func (f *tlsFlags) config(stderr io.Writer) (*tls.Config, error) {
	switch {
	case *f.cert == "" && *f.key == "":
		return nil, nil
	case *f.cert == "" || *f.key == "":
		return nil, fmt.Errorf("--%stls-cert and --%stls-key go together", f.prefix, f.prefix)
	}
	r := &certReloader{cert: *f.cert, key: *f.key, log: newLogger(stderr)}
	if err := r.load(); err != nil {
		return nil, fmt.Errorf("--%stls-cert, --%stls-key: %v", f.prefix, f.prefix, err)
	}
	return &tls.Config{
		GetCertificate: r.get,
		MinVersion:     tls.VersionTLS12,
		CipherSuites: []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
		},
		NextProtos: []string{"http/1.1"},
	}, nil
}

// certReloader serves the pair in its two files, loading it again at a
// handshake that finds either file changed since the last load.
type certReloader struct {
	cert, key string
	log       *slog.Logger

	mu    sync.Mutex
	pair  *tls.Certificate // guarded by mu
	stamp string           // guarded by mu: the files' sizes and times at the last attempt
}

// stampNow identifies the current contents of the two files cheaply.
func (r *certReloader) stampNow() string {
	var b strings.Builder
	for _, name := range []string{r.cert, r.key} {
		if st, err := os.Stat(name); err == nil {
			fmt.Fprintf(&b, "%d/%d;", st.Size(), st.ModTime().UnixNano())
		}
	}
	return b.String()
}

func (r *certReloader) load() error {
	stamp := r.stampNow()
	pair, err := tls.LoadX509KeyPair(r.cert, r.key)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stamp = stamp
	if err == nil {
		r.pair = &pair
	}
	return err
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	changed := r.stampNow() != r.stamp
	r.mu.Unlock()
	if changed {
		if err := r.load(); err != nil {
			r.log.Error("idem: the TLS certificate or key changed but does not load; serving the previous pair", "cert", r.cert, "err", err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pair, nil
}

// newLogger is where the middleware and the store report what they could
// not do (an outcome that failed to store, say). Standard error keeps
// standard output for the few lines a script may parse.
func newLogger(stderr io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(stderr, nil))
}

// serveUntilSignal listens on addr, serves h until SIGINT or SIGTERM, then
// stops accepting connections, lets the requests in flight finish (for at
// most drain) and closes db, so that every outcome the handlers record
// reaches the disk before the process exits. It owns db from the start and
// always closes it.
//
// With tlsConf the listener on addr speaks HTTPS. When adminH is not nil
// it is served on adminAddr too (HTTPS with adminTLS), a listener of its own, and stopped after
// the main server has drained: a scrape during the drain still sees the
// requests finishing.
func serveUntilSignal(name, addr string, tlsConf *tls.Config, dataDir string, drain time.Duration, h http.Handler, adminAddr string, adminTLS *tls.Config, adminH http.Handler, db idem.Store, stdout, stderr io.Writer) int {
	defer func() {
		if err := db.Close(); err != nil {
			fmt.Fprintf(stderr, "idem %s: closing the store: %v\n", name, err)
		}
	}()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
		return 1
	}
	scheme := "http"
	if tlsConf != nil {
		ln, scheme = tls.NewListener(ln, tlsConf), "https"
	}
	var adminLn net.Listener
	adminScheme := "http"
	if adminH != nil {
		if adminLn, err = net.Listen("tcp", adminAddr); err != nil {
			ln.Close()
			fmt.Fprintf(stderr, "idem %s: --admin: %v\n", name, err)
			return 1
		}
		if adminTLS != nil {
			adminLn, adminScheme = tls.NewListener(adminLn, adminTLS), "https"
		}
	}
	log := newLogger(stderr)
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: readHeaderTimeout,
			ReadTimeout:       readTimeout,
			IdleTimeout:       idleTimeout,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
	}
	srv := newServer(h)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 2)
	go func() { served <- srv.Serve(ln) }()
	var adminSrv *http.Server
	if adminLn != nil {
		adminSrv = newServer(adminH)
		go func() { served <- adminSrv.Serve(adminLn) }()
		// Printed before the listening line, so that whoever has read
		// that line also has this one.
		fmt.Fprintf(stdout, "idem %s: admin on %s://%s (/metrics, /healthz)\n", name, adminScheme, adminLn.Addr())
	}
	// Tests and scripts read the real address from this line, which
	// matters with port 0.
	fmt.Fprintf(stdout, "idem %s: listening on %s://%s, data in %s\n", name, scheme, ln.Addr(), dataDir)

	select {
	case err := <-served:
		fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
		srv.Close()
		if adminSrv != nil {
			adminSrv.Close()
		}
		return 1
	case <-ctx.Done():
	}
	// A second signal now kills the process at once, the usual way out of
	// a drain that takes too long.
	stop()
	fmt.Fprintf(stdout, "idem %s: stopping; draining requests in flight (at most %s)\n", name, drain)
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	code := 0
	if err := srv.Shutdown(sctx); err != nil {
		// The handlers still running lose their connection; the outcomes
		// they cannot store stay in progress and are reconciled later,
		// never re-executed.
		fmt.Fprintf(stderr, "idem %s: requests still running after %s are cut off: %v\n", name, drain, err)
		srv.Close()
		code = 1
	}
	if adminSrv != nil {
		// Scrapes and probes are quick; one that is not is cut off
		// rather than holding the store open.
		actx, acancel := context.WithTimeout(context.Background(), adminDrain)
		if adminSrv.Shutdown(actx) != nil {
			adminSrv.Close()
		}
		acancel()
	}
	if code != 0 {
		return code
	}
	fmt.Fprintf(stdout, "idem %s: stopped\n", name)
	return 0
}

// writeProblem answers with an RFC 9457 problem document shaped like the
// middleware's own, so clients parse one kind of error.
func writeProblem(w http.ResponseWriter, p idemhttp.Problem) {
	idemhttp.WriteProblem(w, p, 0)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}
