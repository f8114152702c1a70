package main

import (
	"context"
	"errors"
	"io"
)

// runSim is not built yet; its issue delivers it.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("sim: not built yet")
}
