package summary

import (
	"bytes"
	"testing"
)

func TestContractScopesAndChains(t *testing.T) {
	c := DefaultContract()
	text := bytes.Repeat([]byte("abcdefgh"), c.BlockBytes) // 8 blocks
	a := c.AppendHashes(nil, c.Root("m1", ""), text)
	if len(a) != 8 {
		t.Fatalf("%d hashes, want 8", len(a))
	}
	if b := c.AppendHashes(nil, c.Root("m2", ""), text); b[0] == a[0] {
		t.Error("two models share a block hash")
	}
	if b := c.AppendHashes(nil, c.Root("m1", "salt"), text); b[0] == a[0] {
		t.Error("a cache salt does not scope the chain")
	}
	// Changing block 3 changes hashes 3.. and keeps 0..2.
	mod := bytes.Clone(text)
	mod[3*c.BlockBytes+5] ^= 1
	b := c.AppendHashes(nil, c.Root("m1", ""), mod)
	for i := range a {
		if (a[i] == b[i]) != (i < 3) {
			t.Fatalf("block %d: equal=%v", i, a[i] == b[i])
		}
	}
	if got := len(c.AppendHashes(nil, 0, text[:c.BlockBytes-1])); got != 0 {
		t.Errorf("a partial block was hashed")
	}
	if DefaultContract().ID() != c.ID() || (Contract{BlockBytes: 512, Seed: c.Seed}).ID() == c.ID() {
		t.Error("contract IDs do not pin the block size")
	}
}

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
