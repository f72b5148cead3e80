package main

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
)

func runServe(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := addStoreFlags(fs, "directory of the idempotency store (one process at a time)")
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on; port 0 picks a free one")
	tlsf := addTLSFlags(fs)
	delay := fs.Duration("provider-delay", 0, "how long the simulated payment provider takes per charge or refund; try 5s to see 409 request_in_progress")
	drain := fs.Duration("drain", defaultDrain, "how long SIGTERM waits for requests in flight")
	problemBase := fs.String("problem-base", idemhttp.DefaultProblemBase, "absolute `URI` that begins the type of every problem document the middleware answers: the type is it followed by the code, and the answer links to it (Link rel=describedby)")
	maxStored := byteSize(idem.DefaultMaxBodyBytes)
	fs.Var(&maxStored, "max-stored-body", maxStoredHelp)
	store.addMemory()
	adminToken := adminTokenFlag(fs)
	events := fs.Bool("events", true, "log one line to standard error for every change of a record's state (claimed, replayed, completed, ...); --events=false silences them")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem serve [--data DIR | --store DSN] [--addr ADDR] [--provider-delay D]
                  [--drain D] [--max-stored-body SIZE] [--memory SIZE]
                  [--problem-base URI] [--admin-token-file FILE]
                  [--events=false]

Runs a small payments API behind the idempotency middleware, to try the
contract with curl:

  POST /v1/payments       {"amount": 4200, "currency": "usd", "customer": "cus_1"}
  GET  /v1/payments/{id}
  POST /v1/refunds        {"payment": "pay_...", "amount": 1000}  (amount optional)

Every request needs Authorization: Bearer <token>; the token is the
tenant (there are no accounts, any token works), and POSTs need an
Idempotency-Key. A retry replays the first answer, the same key with
another body gets 422, and a retry while the first is still at the
provider gets 409.

Payments and refunds are kept in memory only and vanish when serve stops.
The idempotency records persist, so after a restart a retry still replays
a payment that this process no longer knows about. They are kept in the
directory --data names, which one process holds at a time, or with
--store DSN in PostgreSQL, which any number of serve and proxy processes
share; serve applies the schema's migrations there when it starts.

For operators, on the same address:

  GET  /metrics           Prometheus metrics of the store and of the
                          middleware's answers (idem_*)
  GET  /healthz           200 ok while the store can be read, else 503
  /v1/admin/...           with an admin token (--admin-token-file, or
                          IDEM_ADMIN_TOKEN), the operator routes that
                          idem inspect, get, stats, resolve, check and
                          compact use with --admin URL; without one they
                          are not served

Every change of a record's state is logged to standard error as one line,
with a hash of the key and of the token, never the key or the token.

Reference: `+docsURL("README.md#try-it")+`

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "idem serve: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	if err := store.validate(); err != nil {
		fmt.Fprintf(stderr, "idem serve: %v\n", err)
		fs.Usage()
		return 2
	}
	if maxStored <= 0 {
		fmt.Fprintf(stderr, "idem serve: --max-stored-body %d must be positive\n", maxStored)
		fs.Usage()
		return 2
	}
	if *delay < 0 || *drain <= 0 {
		fmt.Fprintf(stderr, "idem serve: --provider-delay %s must not be negative, --drain %s must be positive\n", *delay, *drain)
		fs.Usage()
		return 2
	}
	tlsConf, err := tlsf.config()
	if err != nil {
		fmt.Fprintf(stderr, "idem serve: %v\n", err)
		fs.Usage()
		return 2
	}
	token, ok := loadAdminToken("serve", adminToken, stderr)
	if !ok {
		return 2
	}
	log := serveLogger(stderr)
	db, code := store.openServer("serve", serverOptions{maxBodyBytes: int64(maxStored), logger: log, events: *events}, stderr)
	if db == nil {
		return code
	}
	adm, err := newAdmin(db, log)
	var mw func(http.Handler) http.Handler
	if err == nil {
		mw, err = idemhttp.New(idemhttp.Options{Store: db, Tenant: bearerToken, ProblemBase: *problemBase, Logger: log, Observe: adm.observer.Observe})
	}
	if err != nil {
		db.Close()
		fmt.Fprintf(stderr, "idem serve: %v\n", err)
		return 1
	}
	api := &paymentsAPI{delay: *delay, tenants: map[string]*ledger{}}
	mux := http.NewServeMux()
	// Each route is wrapped on its own so that its pattern names the
	// endpoint keys are scoped by.
	mux.Handle("POST /v1/payments", mw(http.HandlerFunc(api.createPayment)))
	mux.Handle("POST /v1/refunds", mw(http.HandlerFunc(api.createRefund)))
	mux.HandleFunc("GET /v1/payments/{id}", api.getPayment)
	// The demo API has no paths of its own there, so the operator's
	// endpoints share its listener.
	adm.register(mux)
	adm.registerOps(mux, token)
	return serveUntilSignal("serve", *addr, tlsConf, store.where(), *drain, mux, "", nil, db, stdout, stderr)
}

// serveLogger is newLogger for serve, whose tenant is a bearer token: a
// credential, which has no business in a log. Every tenant attribute
// (the store's events, the middleware's failures) shows its hash instead,
// the same digest that key_hash uses for keys.
func serveLogger(stderr io.Writer) *slog.Logger {
	hide := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == "tenant" {
			return slog.String("tenant_hash", idem.KeyHash(a.Value.String()))
		}
		return a
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{ReplaceAttr: hide}))
}

// bearerToken is the tenant of a request: its bearer token, as is.
func bearerToken(r *http.Request) (string, error) {
	v, err := oneHeader(r, "Authorization")
	if err != nil {
		return "", errors.New("send an Authorization: Bearer header; its token names the account")
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(v), " ")
	token = strings.TrimSpace(token)
	switch {
	case !ok || !strings.EqualFold(scheme, "Bearer") || token == "":
		return "", errors.New("the Authorization header is not Bearer <token>")
	case len(token) > idem.MaxTenantBytes:
		return "", fmt.Errorf("the bearer token is longer than %d bytes", idem.MaxTenantBytes)
	}
	return token, nil
}

// payment and refund are what the API returns; the JSON is the contract.
type payment struct {
	ID             string `json:"id"`
	Object         string `json:"object"`
	Amount         int64  `json:"amount"`
	AmountRefunded int64  `json:"amount_refunded"`
	Currency       string `json:"currency"`
	Customer       string `json:"customer"`
	Description    string `json:"description,omitempty"`
	Status         string `json:"status"`
	Created        int64  `json:"created"`
}

type refund struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Payment string `json:"payment"`
	Amount  int64  `json:"amount"`
	Status  string `json:"status"`
	Created int64  `json:"created"`
}

// ledger is one tenant's payments.
type ledger struct {
	payments map[string]*payment
}

// paymentsAPI holds the business records, in memory: Pebble's directory
// lock keeps them out of the store's directory, and a demo loses nothing
// that matters by forgetting them.
type paymentsAPI struct {
	delay time.Duration

	mu      sync.Mutex
	tenants map[string]*ledger // guarded by mu
}

func (a *paymentsAPI) ledgerLocked(tenant string) *ledger {
	l := a.tenants[tenant]
	if l == nil {
		l = &ledger{payments: map[string]*payment{}}
		a.tenants[tenant] = l
	}
	return l
}

// provider stands for the call to a payment provider, the slow part of a
// real charge; its delay is what lets a retry overtake the first attempt.
func (a *paymentsAPI) provider() {
	if a.delay > 0 {
		time.Sleep(a.delay)
	}
}

func (a *paymentsAPI) createPayment(w http.ResponseWriter, r *http.Request) {
	tenant, _ := bearerToken(r) // the middleware refused requests without one
	var in struct {
		Amount      json.Number `json:"amount"`
		Currency    string      `json:"currency"`
		Customer    string      `json:"customer"`
		Description string      `json:"description"`
	}
	if err := decodeBody(r, &in); err != nil {
		reject(w, r, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	amount, err := parseAmount(in.Amount)
	if err == nil {
		err = checkCurrency(in.Currency)
	}
	if err == nil && in.Customer == "" {
		err = errors.New("customer is required")
	}
	if err != nil {
		reject(w, r, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	a.provider()
	p := &payment{ID: newID("pay_"), Object: "payment", Amount: amount, Currency: in.Currency,
		Customer: in.Customer, Description: in.Description, Status: "succeeded", Created: time.Now().Unix()}
	a.mu.Lock()
	a.ledgerLocked(tenant).payments[p.ID] = p
	out := *p
	a.mu.Unlock()
	w.Header().Set("Location", "/v1/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, out)
}

func (a *paymentsAPI) getPayment(w http.ResponseWriter, r *http.Request) {
	tenant, err := bearerToken(r)
	if err != nil {
		writeProblem(w, idemhttp.Problem{Status: http.StatusUnauthorized, Code: idem.CodeTenantMissing, Detail: err.Error()})
		return
	}
	a.mu.Lock()
	p, ok := a.ledgerLocked(tenant).payments[r.PathValue("id")]
	var out payment
	if ok {
		out = *p
	}
	a.mu.Unlock()
	if !ok {
		writeProblem(w, idemhttp.Problem{Status: http.StatusNotFound, Code: "payment_not_found", Detail: "no payment " + r.PathValue("id")})
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *paymentsAPI) createRefund(w http.ResponseWriter, r *http.Request) {
	tenant, _ := bearerToken(r)
	var in struct {
		Payment string      `json:"payment"`
		Amount  json.Number `json:"amount"`
	}
	if err := decodeBody(r, &in); err != nil {
		reject(w, r, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	var amount int64
	if in.Amount != "" {
		var err error
		if amount, err = parseAmount(in.Amount); err != nil {
			reject(w, r, http.StatusBadRequest, "invalid_request", err.Error())
			return
		}
	}
	// The amount is set aside before the provider is called, so that two
	// refunds racing for the same payment cannot both take the last cent.
	a.mu.Lock()
	p, ok := a.ledgerLocked(tenant).payments[in.Payment]
	var left int64
	if ok {
		left = p.Amount - p.AmountRefunded
		if amount == 0 {
			amount = left
		}
		if amount > 0 && amount <= left {
			p.AmountRefunded += amount
		}
	}
	a.mu.Unlock()
	switch {
	case !ok:
		reject(w, r, http.StatusNotFound, "payment_not_found", fmt.Sprintf("no payment %q", in.Payment))
		return
	case amount == 0 || amount > left:
		reject(w, r, http.StatusBadRequest, "refund_exceeds_payment", fmt.Sprintf("payment %s has %d left to refund", p.ID, left))
		return
	}
	a.provider()
	rf := refund{ID: newID("re_"), Object: "refund", Payment: p.ID, Amount: amount, Status: "succeeded", Created: time.Now().Unix()}
	writeJSON(w, http.StatusCreated, rf)
}

// reject answers a request that changed nothing, and frees its key: the
// client may fix the request and send it again under the same key.
func reject(w http.ResponseWriter, r *http.Request, status int, code, detail string) {
	idemhttp.Release(r)
	writeProblem(w, idemhttp.Problem{Status: status, Code: code, Detail: detail})
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	// A misspelt member would otherwise be dropped without a word.
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the body is not the JSON object expected: %v", err)
	}
	if dec.More() {
		return errors.New("the body has data after its JSON object")
	}
	return nil
}

// maxAmount bounds an amount in minor units (a million dollars), enough for
// a demo and far from overflow.
const maxAmount = 100_000_000

// parseAmount reads an amount in minor units. Any spelling of a whole
// number is accepted (4200, 4.2e3, 4200.0): the fingerprint treats them as
// one request, so the handler must too.
func parseAmount(n json.Number) (int64, error) {
	v, ok := new(big.Rat).SetString(string(n))
	switch {
	case n == "" || !ok:
		return 0, errors.New("amount is required, a whole number of minor units (cents)")
	case !v.IsInt() || v.Sign() <= 0 || v.Num().Cmp(big.NewInt(maxAmount)) > 0:
		return 0, fmt.Errorf("amount %s must be a whole number of minor units from 1 to %d", n, maxAmount)
	}
	return v.Num().Int64(), nil
}

func checkCurrency(c string) error {
	if len(c) != 3 || strings.ToLower(c) != c || strings.Trim(c, "abcdefghijklmnopqrstuvwxyz") != "" {
		return fmt.Errorf("currency %q must be a lower-case ISO 4217 code such as usd", c)
	}
	return nil
}

func newID(prefix string) string {
	return prefix + strings.ToLower(rand.Text()[:16])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}
