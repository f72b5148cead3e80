package idemhttp

import (
	"errors"
	"net/http"
	"net/textproto"
)

var (
	errKeyMissing   = errors.New("no idempotency key")
	errKeyDuplicate = errors.New("the idempotency key is sent more than once")
)

// hasKey reports whether the request sends a key field at all, well
// formed or not: a client that sends one expects its request protected.
func (m *middleware) hasKey(r *http.Request) bool {
	for _, name := range m.headers {
		if _, ok := r.Header[name]; ok {
			return true
		}
	}
	return false
}

// readKey finds the request's idempotency key in the canonical header or
// one of its aliases. A key sent on several field lines, or under two
// names, is refused: which one would the client mean?
func (m *middleware) readKey(r *http.Request) (string, error) {
	var raw []string
	for _, name := range m.headers {
		raw = append(raw, r.Header.Values(name)...)
	}
	switch {
	case len(raw) == 0:
		return "", errKeyMissing
	case len(raw) > 1:
		return "", errKeyDuplicate
	}
	return m.keys.Parse(raw[0])
}

func canonicalNames(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = textproto.CanonicalMIMEHeaderKey(n)
	}
	return out
}
