// Command payments is a small payments API behind idem's HTTP middleware,
// to try the idempotency-key contract with curl. It is an example of the
// library in a service, not part of the idem binary:
//
//	go run ./examples/payments --provider-delay 3s
//
// POST /v1/payments and POST /v1/refunds need an Idempotency-Key and an
// Authorization: Bearer token, which names the account (any token works).
// Payments live in memory; the idempotency records live in --data, or in
// PostgreSQL with --store, so a retry after a restart still replays.
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
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/pebblestore"
	"github.com/idemkv/idem/pgstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run serves until ctx ends and returns the exit status: 2 for a usage
// mistake, 1 when the store or the listener fails.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	fs.SetOutput(stderr)
	data := fs.String("data", "./idem-data", "directory of the embedded idempotency store (one process at a time)")
	dsn := fs.String("store", "", "PostgreSQL connection string; the records go there instead of --data")
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on; port 0 picks a free one")
	delay := fs.Duration("provider-delay", 0, "how long the simulated payment provider takes per charge or refund; try 3s to see 409 request_in_progress")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || *delay < 0 {
		fmt.Fprintln(stderr, "payments: takes only flags, and --provider-delay must not be negative")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	store, where, err := openStore(ctx, *data, *dsn, log)
	if err != nil {
		fmt.Fprintf(stderr, "payments: %v\n", err)
		return 1
	}
	defer store.Close()
	h, err := newHandler(store, &provider{delay: *delay}, log)
	if err != nil {
		fmt.Fprintf(stderr, "payments: %v\n", err)
		return 1
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "payments: %v\n", err)
		return 1
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "payments: listening on http://%s, records in %s\n", ln.Addr(), where)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Requests in flight finish, so that each one's outcome is stored.
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = srv.Shutdown(sctx)
		cancel()
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "payments: %v\n", err)
		return 1
	}
	return 0
}

// openStore opens the PostgreSQL store when dsn is set, and the embedded
// one in dir otherwise, and says where the records are without repeating
// the DSN, which may hold a password.
func openStore(ctx context.Context, dir, dsn string, log *slog.Logger) (idem.Store, string, error) {
	if dsn != "" {
		s, err := pgstore.Open(ctx, dsn, &pgstore.Options{Events: log, Logger: log})
		return s, "PostgreSQL", err
	}
	s, err := pebblestore.Open(dir, &pebblestore.Options{Events: log, Logger: log})
	if errors.Is(err, pebblestore.ErrLocked) {
		err = fmt.Errorf("%s is in use by another process", dir)
	}
	return s, dir, err
}

// newHandler mounts the API on a mux, each write route wrapped in the
// middleware on its own so that its pattern names the endpoint keys are
// scoped by.
func newHandler(store idem.Store, p *provider, log *slog.Logger) (http.Handler, error) {
	mw, err := idemhttp.New(idemhttp.Options{Store: store, Tenant: account, Logger: log})
	if err != nil {
		return nil, err
	}
	api := &api{provider: p, accounts: map[string]map[string]*payment{}}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw(http.HandlerFunc(api.createPayment)))
	mux.Handle("POST /v1/refunds", mw(http.HandlerFunc(api.createRefund)))
	mux.HandleFunc("GET /v1/payments/{id}", api.getPayment)
	return mux, nil
}
