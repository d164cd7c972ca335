package io.idemd;

/** The work given to once and consume: it gets the lease it runs under. */
@FunctionalInterface
public interface Task {
  void run(Lease lease) throws Exception;
}
