package io.idemd;

/** The work given to run: it gets the lease it runs under and returns its result. */
@FunctionalInterface
public interface Work<T> {
  T run(Lease lease) throws Exception;
}
