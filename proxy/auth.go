package proxy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
)

// KeySet is the set of bearer keys clients may use, loaded from a file
// (one key per line; blank lines and lines starting with # are ignored)
// and reloaded on demand (the router reloads it on SIGHUP). It is safe
// for concurrent use.
type KeySet struct {
	path string
	keys atomic.Pointer[[][sha256.Size]byte]
}

// LoadKeySet reads the keys in path; a file without a key is an error,
// since it would refuse every client.
func LoadKeySet(path string) (*KeySet, error) {
	k := &KeySet{path: path}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload re-reads the file; on error the keys in use stay.
func (k *KeySet) Reload() error {
	b, err := os.ReadFile(k.path)
	if err != nil {
		return fmt.Errorf("api keys: %w", err)
	}
	var keys [][sha256.Size]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		keys = append(keys, sha256.Sum256([]byte(line)))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("api keys in %s: %w", k.path, err)
	}
	if len(keys) == 0 {
		return fmt.Errorf("api keys: %s holds no key", k.path)
	}
	k.keys.Store(&keys)
	return nil
}

// Len reports how many keys are in use.
func (k *KeySet) Len() int { return len(*k.keys.Load()) }

// Valid reports whether key is one of the set. Keys are compared as
// SHA-256 digests in constant time, all of them every time.
func (k *KeySet) Valid(key string) bool {
	if key == "" {
		return false
	}
	d := sha256.Sum256([]byte(key))
	ok := 0
	for _, want := range *k.keys.Load() {
		ok |= subtle.ConstantTimeCompare(d[:], want[:])
	}
	return ok == 1
}
