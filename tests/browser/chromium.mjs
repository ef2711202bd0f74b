// Launching Debian's Chromium headless through playwright-core, with the flags that keep
// it off the network (no background requests, no component updates), and a fresh
// profile each time. Shared by the tests and the screenshot/benchmark scripts.
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const EXECUTABLE = process.env.CHROMIUM || '/usr/bin/chromium';
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

/**
 * A new folder under the system's temporary one, removed when the process exits: each
 * run of the browser tests wrote ~200 MB of pages and profiles there and left them (2.6 GB
 * after a day's runs). With FRAGSCOPE_KEEP_PAGES=1 the pages and screenshots are kept and
 * their folder named, to look at.
 */
export function scratchDir(prefix, keepable = true) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  if (keepable && process.env.FRAGSCOPE_KEEP_PAGES) {
    console.log(`# kept: ${dir}`);
  } else {
    process.on('exit', () => {
      try { rmSync(dir, { recursive: true, force: true }); } catch { /* still in use: left */ }
    });
  }
  return dir;
}

/** A persistent context on a new empty profile directory (Chromium's --user-data-dir). */
export async function launch() {
  const dir = scratchDir('fragscope-chromium-', false);
  return chromium.launchPersistentContext(dir, { executablePath: EXECUTABLE, headless: true, args: FLAGS,
    viewport: { width: 1400, height: 900 } });
}

/**
 * Opens a report; records console errors, page errors and every request. Resolves when
 * the page says it is drawn (body[data-ready]).
 */
export async function open(ctx, file) {
  const page = await ctx.newPage();
  const errors = [], requests = [];
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('request', (r) => requests.push(r.url()));
  await page.goto('file://' + file);
  try {
    await page.waitForSelector('body[data-ready="1"]', { state: 'attached', timeout: 60000 });
  } catch (e) {
    throw new Error(`${file}: the report never said it was drawn; errors: ${errors.join(' | ')}`);
  }
  return { page, errors, requests };
}
