package idemhttp

import (
	"errors"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/idemkv/idem"
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
	return m.parseKey(raw[0])
}

// ParseKey reads an idempotency key field value under the middleware's
// default rules: a bare token or an RFC 8941 sf-string Item, of 1 to 255
// characters of DefaultKeyAlphabet. Other transports of the contract
// (idemgrpc) use it, so that a key is valid on every transport or on none.
func ParseKey(v string) (string, error) {
	return parseKey(v, &defaultAlphabet, idem.MaxKeyBytes, DefaultKeyAlphabet)
}

var defaultAlphabet = func() (a [256]bool) {
	for i := 0; i < len(DefaultKeyAlphabet); i++ {
		a[DefaultKeyAlphabet[i]] = true
	}
	return a
}()

func (m *middleware) parseKey(v string) (string, error) {
	return parseKey(v, &m.alphabet, m.opts.MaxKeyLength, m.opts.KeyAlphabet)
}

// parseKey accepts a bare token or an RFC 8941 sf-string, then checks the
// key's length and alphabet.
func parseKey(v string, alphabet *[256]bool, maxLen int, alphabetText string) (string, error) {
	v = strings.Trim(v, " \t")
	key := v
	if strings.HasPrefix(v, `"`) {
		var err error
		if key, err = parseSFItem(v); err != nil {
			return "", err
		}
	}
	switch {
	case key == "":
		return "", errors.New("the idempotency key is empty")
	case len(key) > maxLen:
		return "", errors.New("the idempotency key is longer than " + strconv.Itoa(maxLen) + " characters")
	}
	for i := 0; i < len(key); i++ {
		if !alphabet[key[i]] {
			return "", errors.New("the idempotency key has a character outside " + alphabetText)
		}
	}
	return key, nil
}

var errBadSFItem = errors.New("the idempotency key is not a valid structured-field string")

// parseSFItem decodes the field as the draft defines it, an RFC 8941 Item
// whose bare item is an sf-string, and returns the string. Parameters are
// checked against the grammar but mean nothing to the key: a client
// library may add its own, and they must not make the key unusable.
func parseSFItem(v string) (string, error) {
	key, rest, ok := cutSFString(v)
	if !ok {
		return "", errBadSFItem
	}
	for rest != "" {
		if rest[0] != ';' {
			return "", errBadSFItem
		}
		rest = strings.TrimLeft(rest[1:], " ")
		n := paramKeyLen(rest)
		if n == 0 {
			return "", errBadSFItem
		}
		rest = rest[n:]
		if strings.HasPrefix(rest, "=") {
			if n = bareItemLen(rest[1:]); n == 0 {
				return "", errBadSFItem
			}
			rest = rest[1+n:]
		}
	}
	return key, nil
}

// cutSFString decodes the sf-string at the start of v (printable ASCII
// between double quotes, where only \" and \\ are escapes) and returns what
// follows it.
func cutSFString(v string) (s, rest string, ok bool) {
	if !strings.HasPrefix(v, `"`) {
		return "", "", false
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '"':
			return b.String(), v[i+1:], true
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", "", false
			}
			b.WriteByte(v[i])
		case c < 0x20 || c > 0x7e:
			return "", "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", "", false
}

// paramKeyLen returns the length of the parameter key at the start of v
// (lcalpha or "*", then lcalpha, digits, "_", "-", "." and "*"), 0 if
// there is none.
func paramKeyLen(v string) int {
	if v == "" || !(isLower(v[0]) || v[0] == '*') {
		return 0
	}
	n := 1
	for n < len(v) && (isLower(v[n]) || isDigit(v[n]) || strings.IndexByte("_-.*", v[n]) >= 0) {
		n++
	}
	return n
}

// bareItemLen returns the length of the RFC 8941 bare item at the start
// of v (integer, decimal, string, token, byte sequence or boolean), 0 if
// there is none.
func bareItemLen(v string) int {
	switch {
	case v == "":
		return 0
	case v[0] == '-' || isDigit(v[0]):
		return numberLen(v)
	case v[0] == '"':
		_, rest, ok := cutSFString(v)
		if !ok {
			return 0
		}
		return len(v) - len(rest)
	case isAlpha(v[0]) || v[0] == '*':
		n := 1
		for n < len(v) && (isTchar(v[n]) || v[n] == ':' || v[n] == '/') {
			n++
		}
		return n
	case v[0] == ':':
		end := strings.IndexByte(v[1:], ':')
		if end < 0 {
			return 0
		}
		for i := 1; i <= end; i++ {
			if c := v[i]; !(isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=') {
				return 0
			}
		}
		return end + 2
	case v[0] == '?':
		if len(v) > 1 && (v[1] == '0' || v[1] == '1') {
			return 2
		}
	}
	return 0
}

// numberLen returns the length of the sf-integer (at most 15 digits) or
// sf-decimal (at most 12 digits, a dot, 1 to 3 digits) at the start of v,
// 0 if there is none.
func numberLen(v string) int {
	n := 0
	if v[0] == '-' {
		n = 1
	}
	start := n
	for n < len(v) && isDigit(v[n]) {
		n++
	}
	whole := n - start
	if whole == 0 {
		return 0
	}
	if n == len(v) || v[n] != '.' {
		if whole > 15 {
			return 0
		}
		return n
	}
	n++
	frac := n
	for n < len(v) && isDigit(v[n]) {
		n++
	}
	if whole > 12 || n-frac < 1 || n-frac > 3 {
		return 0
	}
	return n
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool { return isLower(c | 0x20) }

// isTchar reports whether c may appear in an RFC 9110 token.
func isTchar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func canonicalNames(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = textproto.CanonicalMIMEHeaderKey(n)
	}
	return out
}
