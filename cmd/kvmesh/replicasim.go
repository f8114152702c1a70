package main

import (
	"context"
	"errors"
	"io"
)

// runReplicaSim is not built yet; its issue delivers it.
func runReplicaSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("replica-sim: not built yet")
}
