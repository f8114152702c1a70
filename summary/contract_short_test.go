package summary

import (
	"bytes"
	"testing"
)

// TestShortKey: a text shorter than a block has a key of its own, the
// same for the same text and root; a text of a full block has none.
func TestShortKey(t *testing.T) {
	c := DefaultContract()
	root := c.Root("m", "")
	a, b := c.ShortKey(root, []byte("hello")), c.ShortKey(root, []byte("hullo"))
	if a == 0 || b == 0 || a == b {
		t.Fatalf("keys %x %x: want two distinct, non-zero", a, b)
	}
	if c.ShortKey(root, []byte("hello")) != a {
		t.Fatal("the same text keyed twice differently")
	}
	if c.ShortKey(c.Root("other", ""), []byte("hello")) == a {
		t.Fatal("another model's text shares the key")
	}
	if k := c.ShortKey(root, bytes.Repeat([]byte("x"), c.BlockBytes)); k != 0 {
		t.Fatalf("a full block's text keyed %x", k)
	}
}
