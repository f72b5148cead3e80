package canon

import (
	"bytes"
	"slices"
)

// AppendForm appends the canonical form of an
// application/x-www-form-urlencoded body to dst: its name=value pairs,
// percent-decoded ("+" is a space), ordered by name and encoded again in one
// fixed way. Pairs with the same name keep their order, because many
// servers read a repeated field as a list, where order is meaning. Empty
// segments ("a=1&&b=2") are ignored and a name without "=" has an empty
// value, as net/url reads them.
func AppendForm(dst, src []byte, maxBytes int) ([]byte, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if len(src) > maxBytes {
		return dst, fail(ErrTooLarge, maxBytes, "input is %d bytes, the limit is %d", len(src), maxBytes)
	}
	type pair struct{ name, value []byte }
	var pairs []pair
	// One buffer holds every decoded byte; decoding never grows text.
	buf := make([]byte, 0, len(src))
	for off := 0; off <= len(src); {
		seg := src[off:]
		if j := bytes.IndexByte(seg, '&'); j >= 0 {
			seg = seg[:j]
		}
		if len(seg) > 0 {
			name, value, _ := bytes.Cut(seg, []byte("="))
			var err error
			n0 := len(buf)
			if buf, err = percentDecode(buf, name, off); err != nil {
				return dst, err
			}
			n1 := len(buf)
			if buf, err = percentDecode(buf, value, off+len(name)+1); err != nil {
				return dst, err
			}
			pairs = append(pairs, pair{buf[n0:n1:n1], buf[n1:]})
		}
		off += len(seg) + 1
	}
	slices.SortStableFunc(pairs, func(a, b pair) int { return bytes.Compare(a.name, b.name) })
	for i, p := range pairs {
		if i > 0 {
			dst = append(dst, '&')
		}
		dst = percentEncode(dst, p.name)
		dst = append(dst, '=')
		dst = percentEncode(dst, p.value)
	}
	return dst, nil
}

func percentDecode(dst, b []byte, off int) ([]byte, error) {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '+':
			dst = append(dst, ' ')
		case '%':
			hi, ok1 := unhex(b, i+1)
			lo, ok2 := unhex(b, i+2)
			if !ok1 || !ok2 {
				return dst, fail(ErrSyntax, off+i, `"%%" must be followed by two hex digits`)
			}
			dst = append(dst, hi<<4|lo)
			i += 2
		default:
			dst = append(dst, c)
		}
	}
	return dst, nil
}

func unhex(b []byte, i int) (byte, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch c := b[i]; {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// percentEncode leaves only RFC 3986 unreserved bytes bare, so that every
// decoded string has exactly one encoding.
func percentEncode(dst, b []byte) []byte {
	const upper = "0123456789ABCDEF"
	for _, c := range b {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', upper[c>>4], upper[c&0xF])
	}
	return dst
}
