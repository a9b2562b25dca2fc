//! The Lua scripts the publisher runs. Each runs atomically in Redis, which is what makes
//! fencing and retention safe against a concurrent (deposed) publisher.
//! `redis::Script` sends EVALSHA and reloads on NOSCRIPT, so a restarted Redis is fine.

/// Allocates the next version: `max(counter, floor) + 1`, and raises the epoch counter to
/// at least the caller's epoch. The floors are the highest version the caller knows of
/// (`latest` and what it last published) and its own epoch, so after Redis lost its data
/// (restart without persistence, failover to a lagging replica) the counters are re-seeded
/// above everything already handed out, and the next leader's INCR of `epoch` still fences
/// this one.
///
/// KEYS: version counter, epoch counter. ARGV: version floor, epoch floor.
/// Returns the allocated version.
pub(super) const ALLOCATE: &str = r#"
local counter = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local floor = tonumber(ARGV[1])
if counter < floor then counter = floor end
counter = counter + 1
redis.call('SET', KEYS[1], counter)
local epoch = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if epoch < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return counter
"#;

/// Takes a new epoch: one above the counter, above the epoch stored with `latest`, and
/// above the caller's previous epoch, so a new leader's epoch is the highest even if the
/// counter was lost while `latest` (or the caller's memory) survived.
///
/// KEYS: epoch counter, latest. ARGV: caller's previous epoch (0 if none).
/// Returns the new epoch.
pub(super) const TAKE_EPOCH: &str = r#"
local epoch = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local stored = tonumber(redis.call('HGET', KEYS[2], 'epoch') or '0') or 0
local previous = tonumber(ARGV[1]) or 0
if epoch < stored then epoch = stored end
if epoch < previous then epoch = previous end
epoch = epoch + 1
redis.call('SET', KEYS[1], epoch)
return epoch
"#;

/// Advances `latest` to a blob already written (with a TTL, so an abandoned one expires),
/// if and only if the version is newer than `latest`'s and the epoch is not older than
/// both `latest`'s and the epoch counter (a new leader fences the old one as soon as it
/// takes its epoch). On success: the blob is made persistent, indexed, blobs beyond the
/// newest K get a short TTL (not deleted: a follower may be fetching one), and the new
/// version is announced. On refusal the blob is deleted. Same rule as
/// `bus::check_advance`.
///
/// KEYS: latest, epoch counter, blob, index.
/// ARGV: version, hash, epoch, published_at_ms, keep K, superseded TTL (ms), blob key
/// prefix, notification channel.
/// Returns `{'ok'}`, `{'fenced', version, hash, epoch, published_at_ms}` (fields empty when
/// `latest` is missing) or `{'missing'}` (the blob expired before the advance).
pub(super) const ADVANCE: &str = r#"
local latest = redis.call('HMGET', KEYS[1], 'version', 'hash', 'epoch', 'published_at_ms')
local version = tonumber(ARGV[1])
local epoch = tonumber(ARGV[3])
local taken = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local fenced = epoch < taken
if latest[1] then
  local current_version = tonumber(latest[1]) or 0
  local current_epoch = tonumber(latest[3] or '0') or 0
  if version <= current_version or epoch < current_epoch then fenced = true end
end
if fenced then
  redis.call('DEL', KEYS[3])
  return {'fenced', latest[1] or '', latest[2] or '', latest[3] or '', latest[4] or ''}
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  return {'missing'}
end
redis.call('PERSIST', KEYS[3])
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'hash', ARGV[2], 'epoch', ARGV[3], 'published_at_ms', ARGV[4])
redis.call('ZADD', KEYS[4], version, ARGV[1])
local keep = tonumber(ARGV[5])
local count = redis.call('ZCARD', KEYS[4])
if count > keep then
  local old = redis.call('ZRANGE', KEYS[4], 0, count - keep - 1)
  for _, v in ipairs(old) do
    redis.call('PEXPIRE', ARGV[7] .. v, ARGV[6])
  end
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, count - keep - 1)
end
redis.call('PUBLISH', ARGV[8], ARGV[1])
return {'ok'}
"#;
