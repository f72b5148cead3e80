package idemhttp

import (
	"errors"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
)

var (
	errKeyMissing   = errors.New("no idempotency key")
	errKeyDuplicate = errors.New("the idempotency key is sent more than once")
)

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
	return m.parseKey(raw[0])
}

// parseKey accepts a bare token or an RFC 8941 sf-string, then checks the
// key's length and alphabet.
func (m *middleware) parseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	key := v
	if strings.HasPrefix(v, `"`) {
		var err error
		if key, err = unquoteSFString(v); err != nil {
			return "", err
		}
	}
	switch {
	case key == "":
		return "", errors.New("the idempotency key is empty")
	case len(key) > m.opts.MaxKeyLength:
		return "", errors.New("the idempotency key is longer than " + strconv.Itoa(m.opts.MaxKeyLength) + " characters")
	}
	for i := 0; i < len(key); i++ {
		if !m.alphabet[key[i]] {
			return "", errors.New("the idempotency key has a character outside " + m.opts.KeyAlphabet)
		}
	}
	return key, nil
}

// unquoteSFString decodes an RFC 8941 sf-string: printable ASCII between
// double quotes, where only \" and \\ are escapes.
func unquoteSFString(v string) (string, error) {
	bad := errors.New("the idempotency key is not a valid structured-field string")
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", bad
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v)-1 || (v[i] != '"' && v[i] != '\\') {
				return "", bad
			}
			b.WriteByte(v[i])
		case c == '"' || c < 0x20 || c > 0x7e:
			return "", bad
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

func canonicalNames(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = textproto.CanonicalMIMEHeaderKey(n)
	}
	return out
}
