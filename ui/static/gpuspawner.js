// gpuspawner spawn page: live free counts (progressive enhancement; the form works without it).
//
// Every data-refresh-seconds it re-fetches the spawn page's own path WITHOUT its query string
// (JupyterHub starts a server on a GET to the spawn URL that carries query arguments, and after a
// failed POST the address bar holds ?_xsrf=...), parses the answer with DOMParser and copies, per
// option (data-slug): the availability text, the disabled state and reason, and the count choices.
// The user's selection is never changed: an option that became unavailable while selected stays
// selected and shows its reason; the hub re-validates on submit. Paused while the tab is hidden.
// No innerHTML: only textContent, attributes and values of DOMParser-parsed nodes are copied.
(function () {
  "use strict";
  var script = document.currentScript;
  var root = script && script.closest("[data-gpuspawner]");
  if (!root || root.hasAttribute("data-gs-started")) {
    return;
  }
  root.setAttribute("data-gs-started", "");

  var OPTION = ".gs-option[data-slug]";
  var seconds = parseInt(root.getAttribute("data-refresh-seconds"), 10) || 0;
  var form = root.closest("form");
  var timer = null;
  var busy = false;
  var stopped = false;
  var refreshes = 0;

  function radioOf(option) {
    return option.querySelector("input.gs-radio");
  }

  function countOf(option) {
    return option.querySelector("select[data-gs-count]");
  }

  // An unavailable option is disabled unless it is the user's current choice.
  function settle() {
    root.querySelectorAll(OPTION).forEach(function (option) {
      var radio = radioOf(option);
      var count = countOf(option);
      if (!radio) {
        return;
      }
      radio.disabled = option.classList.contains("gs-disabled") && !radio.checked;
      if (count) {
        count.disabled = radio.disabled || count.options.length === 0;
      }
    });
  }

  // Images that fit the node (c.GPUSpawner.image_requirements): data-gs-images says which image each
  // choice of KubeSpawner's form runs ("" the default, a profile's slug, "<slug>--<option>=<choice>"
  // a choice that sets the image), and each card's data-gs-by-image what it says for each image
  // ([availability, disabled reason, tone]). The hub checks the choice again on submit.
  function parsed(element, name) {
    try {
      return JSON.parse(element.getAttribute(name) || "null");
    } catch (e) {
      return null;
    }
  }

  function imageNow() {
    var images = parsed(root, "data-gs-images");
    if (!images) {
      return null;
    }
    var radio = root.querySelector('input[name="profile"]:checked');
    var slug = radio ? radio.value : "";
    var image = images[slug] || images[""];
    var prefix = "profile-option-" + slug + "--";
    root.querySelectorAll("select[name^='" + prefix + "']").forEach(function (select) {
      var key = slug + "--" + select.name.slice(prefix.length) + "=" + select.value;
      if (images[key]) {
        image = images[key];
      }
    });
    return image;
  }

  function byImage() {
    var image = imageNow();
    if (image === null) {
      return;
    }
    root.querySelectorAll(OPTION).forEach(function (option) {
      var said = (parsed(option, "data-gs-by-image") || {})[image];
      if (!said) {
        return;
      }
      var avail = option.querySelector("[data-gs-avail]");
      var reason = option.querySelector("[data-gs-reason]");
      if (avail) {
        avail.textContent = said[0];
        avail.hidden = !said[0];
        avail.className = avail.className.replace(/gs-tone-[a-z]+/, "gs-tone-" + said[2]);
      }
      if (reason) {
        reason.textContent = said[1];
        reason.hidden = !said[1];
      }
      option.classList.toggle("gs-disabled", !!said[1]);
    });
  }

  function copyText(target, source, selector, withClass) {
    var a = target.querySelector(selector);
    var b = source.querySelector(selector);
    if (!a || !b) {
      return;
    }
    if (a.textContent !== b.textContent) {
      a.textContent = b.textContent;
    }
    a.hidden = b.hidden;
    if (withClass) {
      a.className = b.className;
    }
  }

  function choices(select) {
    return Array.prototype.map.call(select.options, function (o) {
      return [o.value, o.textContent];
    });
  }

  function copyCounts(target, source) {
    var select = countOf(target);
    var fresh = countOf(source);
    if (!select || !fresh) {
      return;
    }
    var current = select.value;
    var currentText =
      select.selectedIndex >= 0 ? select.options[select.selectedIndex].textContent : "";
    var wanted = choices(fresh);
    var values = wanted.map(function (pair) {
      return pair[0];
    });
    if (current !== "" && values.indexOf(current) < 0) {
      // Keep the user's count; the hub tells them on submit if it no longer fits.
      wanted.push([current, currentText]);
      wanted.sort(function (x, y) {
        return Number(x[0]) - Number(y[0]);
      });
    }
    if (JSON.stringify(wanted) !== JSON.stringify(choices(select))) {
      while (select.options.length) {
        select.remove(0);
      }
      wanted.forEach(function (pair) {
        select.add(new Option(pair[1], pair[0]));
      });
    }
    select.value = current !== "" ? current : fresh.value;
  }

  function apply(fresh) {
    copyText(root, fresh, "[data-gs-notice]", false);
    var bySlug = {};
    fresh.querySelectorAll(OPTION).forEach(function (option) {
      bySlug[option.getAttribute("data-slug")] = option;
    });
    root.querySelectorAll(OPTION).forEach(function (option) {
      var source = bySlug[option.getAttribute("data-slug")];
      if (!source) {
        return; // gone from the page: the hub refuses it on submit with a clear message
      }
      copyText(option, source, "[data-gs-avail]", true);
      copyText(option, source, "[data-gs-reason]", false);
      option.classList.toggle("gs-disabled", source.classList.contains("gs-disabled"));
      if (source.hasAttribute("data-gs-by-image")) {
        option.setAttribute("data-gs-by-image", source.getAttribute("data-gs-by-image"));
      }
      copyCounts(option, source);
    });
    byImage();
    settle();
  }

  function showStale(stale) {
    var live = root.querySelector("[data-gs-live]");
    var warn = root.querySelector("[data-gs-stale]");
    if (live && warn) {
      live.hidden = stale;
      warn.hidden = !stale;
    }
  }

  function refresh() {
    if (busy || stopped || document.hidden) {
      return;
    }
    busy = true;
    fetch(window.location.pathname, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { Accept: "text/html" },
    })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.querySelector("[data-gpuspawner]");
        if (!fresh) {
          throw new Error("no GPU options in the answer");
        }
        if (!stopped) {
          apply(fresh);
        }
        showStale(false);
        refreshes += 1;
        root.setAttribute("data-gs-refreshes", String(refreshes));
        root.dispatchEvent(new CustomEvent("gpuspawner:refreshed"));
      })
      .catch(function () {
        showStale(true);
        root.dispatchEvent(new CustomEvent("gpuspawner:refresh-failed"));
      })
      .then(function () {
        busy = false;
      });
  }

  function stop() {
    if (timer !== null) {
      clearInterval(timer);
      timer = null;
    }
  }

  function start() {
    stop();
    if (seconds > 0 && !stopped && !document.hidden) {
      timer = setInterval(refresh, seconds * 1000);
    }
  }

  root.addEventListener("change", function (event) {
    var target = event.target;
    if (target.matches && target.matches("select[data-gs-count]")) {
      // Choosing a count picks its option too.
      var radio = radioOf(target.closest(OPTION));
      if (radio && !radio.disabled && !radio.checked) {
        radio.checked = true;
      }
    }
    byImage();
    settle();
  });

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      stop();
    } else if (!stopped) {
      refresh();
      start();
    }
  });

  if (form) {
    form.addEventListener("submit", function () {
      stopped = true;
      stop();
    });
  }

  if (imageNow() !== null) {
    byImage();
    settle();
  }

  // Other scripts (and the tests) can ask for a refresh now.
  root.addEventListener("gpuspawner:refresh", refresh);

  if (seconds > 0) {
    var status = root.querySelector("[data-gs-status]");
    if (status) {
      status.hidden = false;
    }
    start();
  }
})();
