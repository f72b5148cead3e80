package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/internal/idemtest"
)

// problem decodes the problem document of a refusal, checking that it is
// one and that its status is the response's.
func problem(t *testing.T, resp *http.Response, body string) idemhttp.Problem {
	t.Helper()
	assert.Equal(t, idemhttp.ProblemType, resp.Header.Get("Content-Type"))
	var p idemhttp.Problem
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	assert.Equal(t, resp.StatusCode, p.Status)
	assert.Equal(t, idemhttp.DefaultProblemBase+p.Code, p.Type, "each code has its own type")
	assert.Equal(t, []string{"<" + p.Type + `>; rel="describedby"`}, resp.Header.Values("Link"))
	return p
}

// TestProblemDocument: a refusal is an RFC 9457 document that no cache
// keeps, titled after its status and carrying a stable code. Its detail is
// text, not escaped for HTML, and the members about a refused body appear
// only when there is one.
func TestProblemDocument(t *testing.T) {
	e := setup(t, idemhttp.Options{KeyAlphabet: "ab<>&"})
	resp, body := e.call("POST", "/v1/payments", "acme", pay, "c")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	problem(t, resp, body)
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	assert.Empty(t, resp.Header.Get("Retry-After"), "a bad key is not worth retrying as it is")
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	assert.Equal(t, map[string]any{
		"type": idemhttp.DefaultProblemBase + idem.CodeKeyInvalid, "title": "Bad Request", "status": 400.0,
		"detail": "the idempotency key has a character outside ab<>&", "code": idem.CodeKeyInvalid,
	}, doc)
	assert.Contains(t, body, "ab<>&", "the detail is not escaped for HTML")

	resp, body = e.call("POST", "/v1/payments", "acme", `{"a":`, "ab")
	p := problem(t, resp, body)
	assert.Equal(t, idem.CodeBodyInvalid, p.Code)
	assert.Equal(t, "syntax", p.BodyError)
	require.NotNil(t, p.BodyOffset)
	assert.Equal(t, 5, *p.BodyOffset, "where the body ends too soon")
}

// TestProblemTypes: clients tell problems apart by type (RFC 9457), so the
// two 409s, one to retry and one not to, have different ones, and each
// type links to its documentation. The base is the deployment's choice.
func TestProblemTypes(t *testing.T) {
	base := "https://docs.example.com/errors/"
	e := setup(t, idemhttp.Options{ProblemBase: base})
	started, release := make(chan struct{}), make(chan struct{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "unknown" {
			idemhttp.MarkUnknown(r)
			w.WriteHeader(http.StatusGatewayTimeout)
			return
		}
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.call("POST", "/v1/payments", "acme", pay, "busy")
	}()
	<-started
	busy, busyBody := e.call("POST", "/v1/payments", "acme", pay, "busy")
	close(release)
	<-done
	e.call("POST", "/v1/payments", "acme", pay, "unknown")
	pending, pendingBody := e.call("POST", "/v1/payments", "acme", pay, "unknown")
	missing, missingBody := e.call("POST", "/v1/payments", "acme", pay)
	reuse, reuseBody := e.call("POST", "/v1/payments", "acme", `{"amount":1}`, "busy")

	for _, c := range []struct {
		resp   *http.Response
		body   string
		status int
		code   string
	}{
		{busy, busyBody, http.StatusConflict, idem.CodeInProgress},
		{pending, pendingBody, http.StatusConflict, idem.CodeOutcomePending},
		{missing, missingBody, http.StatusBadRequest, idem.CodeKeyMissing},
		{reuse, reuseBody, http.StatusUnprocessableEntity, idem.CodeKeyReuse},
	} {
		assert.Equal(t, c.status, c.resp.StatusCode, c.code)
		var p idemhttp.Problem
		require.NoError(t, json.Unmarshal([]byte(c.body), &p), c.body)
		assert.Equal(t, c.code, p.Code)
		assert.Equal(t, base+c.code, p.Type)
		assert.Equal(t, "<"+base+c.code+`>; rel="describedby"`, c.resp.Header.Get("Link"), c.code)
	}
}

func TestProblemBaseMustBeAnAbsoluteURI(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	for _, base := range []string{"errors/", "://x", "https://docs.example.com/a b#"} {
		_, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: bearer, ProblemBase: base})
		require.Error(t, err, base)
		assert.Contains(t, err.Error(), "Options.ProblemBase", base)
	}
}
