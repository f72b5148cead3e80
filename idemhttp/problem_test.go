package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/contract"
	"github.com/idemkv/idem/idemhttp"
)

// problem decodes the problem document of a refusal, checking that it is
// one and that its status is the response's.
func problem(t *testing.T, resp *http.Response, body string) idemhttp.Problem {
	t.Helper()
	assert.Equal(t, idemhttp.ProblemType, resp.Header.Get("Content-Type"))
	var p idemhttp.Problem
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	assert.Equal(t, resp.StatusCode, p.Status)
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
		"type": "about:blank", "title": "Bad Request", "status": 400.0,
		"detail": "the idempotency key has a character outside ab<>&", "code": contract.CodeKeyInvalid,
	}, doc)
	assert.Contains(t, body, "ab<>&", "the detail is not escaped for HTML")

	resp, body = e.call("POST", "/v1/payments", "acme", `{"a":`, "ab")
	p := problem(t, resp, body)
	assert.Equal(t, contract.CodeBodyInvalid, p.Code)
	assert.Equal(t, "syntax", p.BodyError)
	require.NotNil(t, p.BodyOffset)
	assert.Equal(t, 5, *p.BodyOffset, "where the body ends too soon")
}
