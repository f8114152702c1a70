package proxy

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadKnown: a body read into one allocation of its declared length
// is the same bytes readLimited reads, ends at EOF, and a body longer than
// declared is read on under the limit, never past it.
func TestReadKnown(t *testing.T) {
	body := strings.Repeat("0123456789", 100) // 1,000 bytes
	tests := []struct {
		name     string
		r        io.Reader
		declared int64
		limit    int64
		want     string
		err      error
	}{
		{"exact", strings.NewReader(body), 1000, 2000, body, nil},
		{"one byte per read", iotest.OneByteReader(strings.NewReader(body)), 1000, 2000, body, nil},
		{"data with EOF", iotest.DataErrReader(strings.NewReader(body)), 1000, 2000, body, nil},
		{"longer than declared", strings.NewReader(body), 600, 2000, body, nil},
		{"longer than declared, over the limit", strings.NewReader(body), 600, 999, "", errBodyTooLarge},
		{"longer than declared, at the limit", strings.NewReader(body), 600, 1000, body, nil},
		{"one byte past a declared limit", strings.NewReader(body), 999, 999, "", errBodyTooLarge},
		{"shorter than declared", strings.NewReader(body), 1001, 2000, "", io.ErrUnexpectedEOF},
		{"read error", iotest.ErrReader(errors.New("boom")), 10, 2000, "", errors.New("boom")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readKnown(nil, tc.r, tc.declared, tc.limit)
			switch {
			case tc.err == nil && err != nil:
				t.Fatalf("error %v", err)
			case tc.err != nil && (err == nil || err.Error() != tc.err.Error()):
				t.Fatalf("error %v, want %v", err, tc.err)
			case tc.err == nil && !bytes.Equal(got, []byte(tc.want)):
				t.Fatalf("read %d bytes, want %d", len(got), len(tc.want))
			}
		})
	}
}

// TestBodyBufClasses: a lent body buffer holds the body with readKnown's
// extra byte, is at most about twice the body (a long stream keeps it for
// its whole life), and goes back to the class it came from.
func TestBodyBufClasses(t *testing.T) {
	for _, n := range []int64{1, 100, 8 << 10, 8<<10 + 1, 20 << 10, 32 << 10, 40 << 10, preallocBody} {
		b := bodyBufs.get(n)
		if b == nil {
			t.Fatalf("n=%d: no buffer", n)
		}
		if c := int64(cap(*b)); c <= n || c > max(2*n, 8<<10)+1 {
			t.Errorf("n=%d: capacity %d", n, c)
		}
		if bodyClass(int64(cap(*b)-1)) != bodyClass(n) {
			t.Errorf("n=%d: capacity %d goes back to class %d, not %d", n, cap(*b), bodyClass(int64(cap(*b)-1)), bodyClass(n))
		}
		bodyBufs.put(b)
	}
	for _, n := range []int64{-1, 0, preallocBody + 1} {
		if bodyBufs.get(n) != nil {
			t.Errorf("n=%d: a buffer lent for a body of unknown or large size", n)
		}
	}
}
