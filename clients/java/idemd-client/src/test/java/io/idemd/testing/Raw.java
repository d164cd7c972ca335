package io.idemd.testing;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.List;
import java.util.stream.Stream;

/**
 * What idemd and its store hold, read without the SDK: a record as the HTTP API answers it, and
 * whether the bytes of the embedded store's files contain a string anywhere.
 */
public final class Raw {
  private static final HttpClient HTTP = HttpClient.newHttpClient();

  private Raw() {}

  /** The record of key as GET /v1/records/{key} answers it, read as JSON. */
  public static JsonNode record(Daemon daemon, String key)
      throws IOException, InterruptedException {
    HttpResponse<String> res =
        HTTP.send(
            HttpRequest.newBuilder(
                    URI.create(
                        daemon.url
                            + "/v1/records/"
                            + URLEncoder.encode(key, StandardCharsets.UTF_8).replace("+", "%20")))
                .build(),
            HttpResponse.BodyHandlers.ofString());
    if (res.statusCode() != 200) {
      throw new AssertionError("lookup of " + key + ": " + res.statusCode() + " " + res.body());
    }
    return new ObjectMapper().readTree(res.body());
  }

  /** POSTs body to path of idemd's API, and returns its answer, which must be a success. */
  public static JsonNode post(Daemon daemon, String path, JsonNode body)
      throws IOException, InterruptedException {
    HttpResponse<String> res =
        HTTP.send(
            HttpRequest.newBuilder(URI.create(daemon.url + path))
                .header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(body.toString()))
                .build(),
            HttpResponse.BodyHandlers.ofString());
    if (res.statusCode() / 100 != 2) {
      throw new AssertionError(path + ": " + res.statusCode() + " " + res.body());
    }
    return new ObjectMapper().readTree(res.body());
  }

  /** The bytes of a base64 member, such as a record's response.sealed. */
  public static byte[] bytes(JsonNode base64) {
    if (!base64.isTextual()) {
      throw new AssertionError("not a base64 string: " + base64);
    }
    return Base64.getDecoder().decode(base64.asText());
  }

  /** Whether any file of the daemon's store holds text, as UTF-8, anywhere in its bytes. */
  public static boolean storeHolds(Daemon daemon, String text) {
    byte[] needle = text.getBytes(StandardCharsets.UTF_8);
    try (Stream<Path> files = Files.walk(daemon.dataDir())) {
      List<Path> regular = files.filter(Files::isRegularFile).toList();
      if (regular.isEmpty()) {
        throw new AssertionError("the store has no files in " + daemon.dataDir());
      }
      for (Path p : regular) {
        if (indexOf(Files.readAllBytes(p), needle) >= 0) {
          return true;
        }
      }
      return false;
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static int indexOf(byte[] haystack, byte[] needle) {
    outer:
    for (int i = 0; i + needle.length <= haystack.length; i++) {
      for (int j = 0; j < needle.length; j++) {
        if (haystack[i + j] != needle[j]) {
          continue outer;
        }
      }
      return i;
    }
    return -1;
  }
}
