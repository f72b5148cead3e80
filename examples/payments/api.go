package main

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
)

// account is the tenant of a request: a digest of its bearer token, so
// that the credential itself is neither stored, nor listed by the operator
// tools, nor logged.
func account(r *http.Request) (string, error) {
	vs := r.Header.Values("Authorization")
	if len(vs) != 1 {
		return "", errors.New("send one Authorization: Bearer header; its token names the account")
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(vs[0]), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", errors.New("the Authorization header is not Bearer <token>")
	}
	return "acct_" + idem.KeyHash(token), nil
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

// api holds the business records, in memory: an example loses nothing
// that matters by forgetting them, and the idempotency records it keeps
// are what a retry after a restart needs.
type api struct {
	provider *provider

	mu       sync.Mutex
	accounts map[string]map[string]*payment // tenant to payment ID; guarded by mu
}

// paymentLocked finds a tenant's payment. It adds no ledger: a caller
// that only reads, under any token it makes up, must not grow the map.
func (a *api) paymentLocked(acct, id string) (*payment, bool) {
	p, ok := a.accounts[acct][id]
	return p, ok
}

// provider stands for the call to a payment provider, the slow part of a
// real charge; its delay is what lets a retry overtake the first attempt.
// A test holds calls at the gate instead: entered hears of each call, and
// the call returns once the test sends on gate.
type provider struct {
	delay   time.Duration
	entered chan struct{}
	gate    chan struct{}
}

func (p *provider) call() {
	if p.gate != nil {
		p.entered <- struct{}{}
		<-p.gate
	}
	time.Sleep(p.delay)
}

func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	acct, _ := account(r) // the middleware refused requests without one
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
	a.provider.call()
	p := &payment{ID: newID("pay_"), Object: "payment", Amount: amount, Currency: in.Currency,
		Customer: in.Customer, Description: in.Description, Status: "succeeded", Created: time.Now().Unix()}
	a.mu.Lock()
	if a.accounts[acct] == nil {
		a.accounts[acct] = map[string]*payment{}
	}
	a.accounts[acct][p.ID] = p
	out := *p
	a.mu.Unlock()
	w.Header().Set("Location", "/v1/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, out)
}

func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	acct, err := account(r)
	if err != nil {
		idemhttp.WriteProblem(w, idemhttp.Problem{Status: http.StatusUnauthorized, Code: idem.CodeTenantMissing, Detail: err.Error()}, 0)
		return
	}
	a.mu.Lock()
	p, ok := a.paymentLocked(acct, r.PathValue("id"))
	var out payment
	if ok {
		out = *p
	}
	a.mu.Unlock()
	if !ok {
		idemhttp.WriteProblem(w, idemhttp.Problem{Status: http.StatusNotFound, Code: "payment_not_found", Detail: "no payment " + r.PathValue("id")}, 0)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) createRefund(w http.ResponseWriter, r *http.Request) {
	acct, _ := account(r)
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
	p, ok := a.paymentLocked(acct, in.Payment)
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
	a.provider.call()
	rf := refund{ID: newID("re_"), Object: "refund", Payment: p.ID, Amount: amount, Status: "succeeded", Created: time.Now().Unix()}
	writeJSON(w, http.StatusCreated, rf)
}

// reject answers a request that changed nothing, and frees its key: the
// client may fix the request and send it again under the same key.
func reject(w http.ResponseWriter, r *http.Request, status int, code, detail string) {
	idemhttp.Release(r)
	idemhttp.WriteProblem(w, idemhttp.Problem{Status: status, Code: code, Detail: detail}, 0)
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
